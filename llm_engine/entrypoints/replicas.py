"""`codeyard llm serve --data-parallel-size N`: N replica servers as child processes on loopback
ports (each with a key only the router knows), and the router in front; with
`--distributed-executor ray`, as Ray actors on the cluster's nodes (`llm_engine/ray_servers.py`).
The disaggregated launcher starts its prefill and decode instances the same way. A child that
dies while they serve is started again on its port (`Supervisor`)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
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
    yields once all answer /health, restarts any that dies meanwhile (`procs` then holds the new
    process), and stops them on the way out."""
    key = secrets.token_urlsafe(24)
    cli = [str(Path(sys.executable).parent / "codeyard"), "llm", "serve"]
    ports = [free_port() for _ in arg_lists]
    commands = [[*cli, *args, "--host", "127.0.0.1", "--port", str(port), "--api-key", key]
                for args, port in zip(arg_lists, ports)]
    cores = cpus or [None] * len(arg_lists)
    procs = [start_child(command, core) for command, core in zip(commands, cores)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    def ended(index: int) -> str | None:
        return None if procs[index].poll() is None else f"exited with code {procs[index].returncode}"

    def restart(index: int) -> None:
        procs[index] = start_child(commands[index], cores[index])

    supervisor = Supervisor(names, ended, restart)
    try:
        wait_healthy(names, urls, ended, ready_timeout_s)
        supervisor.start()
        yield ChildServers(urls, key, procs)
    finally:
        supervisor.stop()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_child(command: list[str], cores: set[int] | None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(command)
    if cores:  # before the child has imported torch, so its thread pool sees these cores only
        os.sched_setaffinity(proc.pid, cores)
    return proc


# Seconds before starting a child again after its 1st, 2nd, ... death in a row; one that served for
# STABLE_S before it died starts the count again. A child that cannot start (its model gone, its
# port taken) is then retried every minute instead of in a loop.
RESTART_DELAYS_S = (0.0, 2.0, 5.0, 15.0, 60.0)
STABLE_S = 60.0


class Supervisor(threading.Thread):
    """Starts a server again when it ends while the group serves: the router and the proxy leave an
    unreachable server out for a while and then find it at the same URL. Requests it was running
    are lost (their streams end with an error event); a restarted prefill instance has a new KV
    pool, and the decode instance maps it at its next pull. vLLM leaves this to an orchestrator;
    here the launcher is the orchestrator. `ended(i)` says how server i ended (None while it runs)
    and `restart(i)` starts it again where it was: a child process or a Ray actor."""

    POLL_S = 0.5

    def __init__(self, names: list[str], ended: Callable[[int], str | None], restart: Callable[[int], None]) -> None:
        super().__init__(name="llm-supervisor", daemon=True)
        self.names, self.ended, self.restart = names, ended, restart
        self.started_at = [time.monotonic()] * len(names)
        self.deaths = [0] * len(names)  # in a row
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # stop() waits for a start under way

    def run(self) -> None:
        due: dict[int, float] = {}  # server -> when it starts again
        while not self._stopping.wait(self.POLL_S):
            now = time.monotonic()
            for index, name in enumerate(self.names):
                if index not in due and (how := self.ended(index)) is not None:
                    lived = now - self.started_at[index]
                    self.deaths[index] = 1 if lived >= STABLE_S else self.deaths[index] + 1
                    delay = RESTART_DELAYS_S[min(self.deaths[index], len(RESTART_DELAYS_S)) - 1]
                    log.warning("LLM: %s %s after %.0f s; starting it again in %.0f s", name, how, lived, delay)
                    due[index] = now + delay
            for index, at in list(due.items()):
                if at <= now:
                    with self._lock:
                        if self._stopping.is_set():
                            return
                        try:
                            self.restart(index)
                        except Exception:  # noqa: BLE001 - a start that failed counts as another death
                            log.exception("LLM: starting %s again failed", self.names[index])
                    self.started_at[index] = time.monotonic()
                    self.restarts += 1
                    del due[index]

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
        if self.is_alive():
            self.join()


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
