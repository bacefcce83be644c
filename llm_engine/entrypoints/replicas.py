"""`codeyard llm serve --data-parallel-size N` on one machine: N replica servers as child
processes on loopback ports (each with a key only the router knows), and the router in front."""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

log = logging.getLogger("codeyard.llm")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def replica_servers(serve_args: list[str], count: int, ready_timeout_s: float = 900) -> Iterator[tuple[list[str], str]]:
    """Start `count` replicas of `codeyard llm serve <serve_args>`; yields (their URLs, their key)
    once all answer /health, and stops them (process groups) on the way out."""
    key = secrets.token_urlsafe(24)
    cli = [str(Path(sys.executable).parent / "codeyard"), "llm", "serve"]
    ports = [_free_port() for _ in range(count)]
    procs = [subprocess.Popen([*cli, *serve_args, "--host", "127.0.0.1", "--port", str(port), "--api-key", key])
             for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        deadline = time.monotonic() + ready_timeout_s
        for i, (proc, url) in enumerate(zip(procs, urls)):
            while not _healthy(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"replica {i} exited with code {proc.returncode} while loading")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {i} did not load within {ready_timeout_s:.0f} s")
                time.sleep(0.5)
            log.info("LLM: replica %d of %d ready at %s", i + 1, count, url)
        yield urls, key
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
