"""`codeyard llm serve --data-parallel-size N` on one machine: N replica servers as child
processes on loopback ports (each with a key only the router knows), and the router in front.
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
from collections.abc import Iterator
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
class ChildServers:
    """`codeyard llm serve` children on loopback ports: their URLs, the key they take, their processes."""

    urls: list[str]
    key: str
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
        deadline = time.monotonic() + ready_timeout_s
        for name, proc, url in zip(names, procs, urls):
            while not _healthy(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode} while loading")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not load within {ready_timeout_s:.0f} s")
                time.sleep(0.5)
            log.info("LLM: %s ready at %s", name, url)
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


@contextlib.contextmanager
def replica_servers(serve_args: list[str], count: int, ready_timeout_s: float = 900) -> Iterator[tuple[list[str], str]]:
    """Start `count` replicas of `codeyard llm serve <serve_args>`; yields (their URLs, their key)
    once all answer /health, and stops them on the way out."""
    names = [f"replica {i + 1} of {count}" for i in range(count)]
    with child_servers([serve_args] * count, names, ready_timeout_s=ready_timeout_s) as children:
        yield children.urls, children.key


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
