"""`codeyard llm serve --disaggregated`: a prefill and a decode instance sharing a key only the
proxy knows (also the key of the prefill instance's KV port). On one machine they are child
processes, each engine pinned to a core of its own when there are two (the proxy, this process,
and the decode instance's API process beside the prefill instance); with `--distributed-executor ray`
they are Ray actors (`llm_engine/ray_servers.py`), on different nodes with STRICT_SPREAD."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from llm_engine.entrypoints.replicas import ChildServers, child_servers, free_port
from llm_engine.kv_pool_files import sweep_dead_pools

NAMES = ["prefill instance", "decode instance"]


def instance_cores(pin: bool, per_instance: int = 1) -> list[set[int] | None] | None:
    """Cores of their own for the prefill and the decode instance, when this process may use two:
    `per_instance` each (a core per tensor-parallel rank) where there are that many, else one."""
    cores = sorted(os.sched_getaffinity(0)) if pin and hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return None
    each = per_instance if len(cores) >= 2 * per_instance else 1
    return [set(cores[:each]), set(cores[each:2 * each])]


# The prefill instance's step budget (tokens), unless --max-num-batched-tokens is given: vLLM's
# chunked-prefill default before V1. A long prompt then runs in chunks of ~0.35 s on one CPU core
# (SmolLM2-135M bf16) instead of one ~1.5 s step for 2k tokens, and a short prompt arriving meanwhile
# waits for one chunk, not the whole prompt (it goes first: the scheduler's priority policy lets
# waiting requests of higher priority ahead of a running prompt's chunks).
PREFILL_STEP_TOKENS = 512


def role_args(serve_args: list[str], kv_host: str, kv_port: int, kv_transport: str) -> list[list[str]]:
    """The prefill and the decode instance's arguments: the decode side pulls from kv_host:kv_port.
    The prefill instance takes its queue by priority, which the proxy sets to the prompt's length
    (`disagg_proxy.prefill_payload`), in steps of PREFILL_STEP_TOKENS unless a budget is given.
    Why: a short prompt that waited on the prefill instance for a whole 2k-token prompt reached the
    decode instance with the others held up with it, so its batch jumped (a 2-round quiet trace: 6
    joined in one step, then 8-9 rows at 20-34 ms a step against 12 ms at 1-2)."""
    kv = ["--kv-host", kv_host, "--kv-port", str(kv_port)]
    budget = [] if "--max-num-batched-tokens" in serve_args else ["--max-num-batched-tokens", str(PREFILL_STEP_TOKENS)]
    return [[*serve_args, "--role", "prefill", *kv, "--scheduling-policy", "priority", *budget],
            [*serve_args, "--role", "decode", *kv, "--kv-transport", kv_transport]]


@contextlib.contextmanager
def disaggregated_servers(serve_args: list[str], kv_transport: str = "shm", pin: bool = True,
                          ready_timeout_s: float = 900, cores_per_instance: int = 1) -> Iterator[ChildServers]:
    """Start the pair; yields once both answer /health (urls: prefill, decode), stops them after
    and removes the prefill instance's KV pool file if it could not (killed). Pinned, this process
    runs on the prefill instance's core meanwhile (`proxy_beside_prefill`), and so does the decode
    instance's API process (`decode_engine_alone`); an instance's tensor-parallel ranks share its
    cores, a thread each."""
    cpus = instance_cores(pin, cores_per_instance)
    threads = ["--num-threads", "1"] if cpus else []
    arg_lists = role_args([*serve_args, *threads], "127.0.0.1", free_port(), kv_transport)
    if cpus and cores_per_instance == 1:
        cpus, arg_lists[1] = decode_engine_alone(cpus, arg_lists[1])
    try:
        with child_servers(arg_lists, NAMES, cpus, ready_timeout_s) as children, \
                proxy_beside_prefill(cpus[0] if cpus else None):
            yield children
    finally:
        sweep_dead_pools()


def decode_engine_alone(cpus: list[set[int] | None], decode_args: list[str]) -> tuple[list[set[int] | None], list[str]]:
    """The decode instance's engine core process on the decode core (`--engine-cpus`), its API
    process (HTTP, the stream of every token to the proxy) on the prefill instance's core beside
    the proxy: on one core the API process's wake-ups for each step's tokens ran between the
    engine's steps. Time it takes from the prefill instance costs TTFT only, as the proxy's does."""
    prefill, decode = cpus
    assert prefill is not None and decode is not None
    return [prefill, prefill], [*decode_args, "--engine-cpus", ",".join(map(str, sorted(decode)))]


@contextlib.contextmanager
def proxy_beside_prefill(cores: set[int] | None) -> Iterator[None]:
    """Every thread of this process (the proxy) on the prefill instance's cores while the pair
    serves. The proxy relays every token it streams; left to the OS it runs where there is room,
    which during a burst of long prompts (the prefill core busy) is the decode instance's core, so
    its CPU came out of the decode steps. Time taken from the prefill instance costs TTFT only."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    _pin_threads(cores)
    try:
        yield
    finally:
        _pin_threads(before)


def _pin_threads(cores: set[int]) -> None:
    """All of this process's threads: sched_setaffinity(0) moves only the calling one."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cores)
