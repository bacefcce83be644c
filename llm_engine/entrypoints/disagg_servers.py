"""`codeyard llm serve --disaggregated`: a prefill and a decode instance sharing a key only the
proxy knows (also the key of the prefill instance's KV port). On one machine they are child
processes, each pinned to a core of its own when there are two; with `--distributed-executor ray`
they are Ray actors (`llm_engine/ray_servers.py`), on different nodes with STRICT_SPREAD."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from llm_engine.entrypoints.replicas import ChildServers, child_servers, free_port
from llm_engine.kv_pool_files import sweep_dead_pools

NAMES = ["prefill instance", "decode instance"]


def instance_cores(pin: bool) -> list[set[int] | None] | None:
    """One core each for the prefill and the decode instance, when this process may use two."""
    cores = sorted(os.sched_getaffinity(0)) if pin and hasattr(os, "sched_getaffinity") else []
    return [{cores[0]}, {cores[1]}] if len(cores) >= 2 else None


def role_args(serve_args: list[str], kv_host: str, kv_port: int, kv_transport: str) -> list[list[str]]:
    """The prefill and the decode instance's arguments: the decode side pulls from kv_host:kv_port."""
    kv = ["--kv-host", kv_host, "--kv-port", str(kv_port)]
    return [[*serve_args, "--role", "prefill", *kv],
            [*serve_args, "--role", "decode", *kv, "--kv-transport", kv_transport]]


@contextlib.contextmanager
def disaggregated_servers(serve_args: list[str], kv_transport: str = "shm", pin: bool = True,
                          ready_timeout_s: float = 900) -> Iterator[ChildServers]:
    """Start the pair; yields once both answer /health (urls: prefill, decode), stops them after
    and removes the prefill instance's KV pool file if it could not (killed)."""
    cpus = instance_cores(pin)
    threads = ["--num-threads", "1"] if cpus else []
    arg_lists = role_args([*serve_args, *threads], "127.0.0.1", free_port(), kv_transport)
    try:
        with child_servers(arg_lists, NAMES, cpus, ready_timeout_s) as children:
            yield children
    finally:
        sweep_dead_pools()
