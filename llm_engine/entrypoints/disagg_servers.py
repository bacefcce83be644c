"""`codeyard llm serve --disaggregated` on one machine: a prefill and a decode instance as child
processes, each pinned to a core of its own when there are two, sharing a key only the proxy knows
(also the key of the prefill instance's KV port)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from llm_engine.entrypoints.replicas import ChildServers, child_servers, free_port


def instance_cores(pin: bool) -> list[set[int] | None] | None:
    """One core each for the prefill and the decode instance, when this process may use two."""
    cores = sorted(os.sched_getaffinity(0)) if pin and hasattr(os, "sched_getaffinity") else []
    return [{cores[0]}, {cores[1]}] if len(cores) >= 2 else None


@contextlib.contextmanager
def disaggregated_servers(serve_args: list[str], kv_transport: str = "shm", pin: bool = True,
                          ready_timeout_s: float = 900) -> Iterator[ChildServers]:
    """Start the pair; yields once both answer /health (urls: prefill, decode), stops them after."""
    kv_port = free_port()
    cpus = instance_cores(pin)
    threads = ["--num-threads", "1"] if cpus else []
    prefill = [*serve_args, *threads, "--role", "prefill", "--kv-port", str(kv_port)]
    decode = [*serve_args, *threads, "--role", "decode", "--kv-port", str(kv_port), "--kv-transport", kv_transport]
    with child_servers([prefill, decode], ["prefill instance", "decode instance"], cpus, ready_timeout_s) as children:
        yield children
