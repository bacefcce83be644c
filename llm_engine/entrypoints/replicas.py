"""`codeyard llm serve --data-parallel-size N`: N replica servers as child processes on loopback
ports (each with a key only the router knows), and the router in front; with
`--distributed-executor ray`, as Ray actors on the cluster's nodes (`llm_engine/ray_servers.py`).
The disaggregated launcher starts its prefill and decode instances the same way."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger("codeyard.llm")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Servers:
    """Started `codeyard llm serve` servers: their URLs and the key they take."""

    urls: list[str]
    key: str


@dataclass
class ChildServers(Servers):
    """Servers that are child processes on loopback ports."""

    procs: list[subprocess.Popen[bytes]]


@contextlib.contextmanager
def child_servers(arg_lists: list[list[str]], names: list[str], cpus: list[set[int] | None] | None = None,
                  ready_timeout_s: float = 900) -> Iterator[ChildServers]:
    """Start `codeyard llm serve <args>` per entry of `arg_lists` (pinned to `cpus` where given);
    yields once all answer /health, and stops them on the way out."""
    key = secrets.token_urlsafe(24)
    cli = [str(Path(sys.executable).parent / "codeyard"), "llm", "serve"]
    ports = [free_port() for _ in arg_lists]
    procs = []
    for args, port, cores in zip(arg_lists, ports, cpus or [None] * len(arg_lists)):
        procs.append(subprocess.Popen([*cli, *args, "--host", "127.0.0.1", "--port", str(port), "--api-key", key]))
        if cores:  # before the child has imported torch, so its thread pool sees these cores only
            os.sched_setaffinity(procs[-1].pid, cores)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        wait_healthy(names, urls, lambda i: None if procs[i].poll() is None else f"exited with code "
                     f"{procs[i].returncode}", ready_timeout_s)
        yield ChildServers(urls, key, procs)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(names: list[str], urls: list[str], ended: Callable[[int], str | None], ready_timeout_s: float) -> None:
    """Until every server answers /health; one that `ended` (how, else None) or is still loading
    after `ready_timeout_s` is an error naming it."""
    deadline = time.monotonic() + ready_timeout_s
    for index, (name, url) in enumerate(zip(names, urls)):
        while not _healthy(url):
            if (how := ended(index)) is not None:
                raise RuntimeError(f"{name} {how} while loading")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not load within {ready_timeout_s:.0f} s")
            time.sleep(0.5)
        log.info("LLM: %s ready at %s", name, url)


@contextlib.contextmanager
def replica_servers(serve_args: list[str], count: int, ready_timeout_s: float = 900) -> Iterator[tuple[list[str], str]]:
    """Start `count` replicas of `codeyard llm serve <serve_args>`; yields (their URLs, their key)
    once all answer /health, and stops them on the way out."""
    with child_servers([serve_args] * count, replica_names(count), ready_timeout_s=ready_timeout_s) as children:
        yield children.urls, children.key


def replica_names(count: int) -> list[str]:
    return [f"replica {i + 1} of {count}" for i in range(count)]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
