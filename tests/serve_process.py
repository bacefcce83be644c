"""`codeyard serve` as a subprocess on a free port (browser tests, replica tests, benchmarks)."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


READY_TIMEOUT_S = 120


@contextmanager
def codeyard_serve(data_dir: Path, settings: Mapping[str, str | None] | None = None,
                   log_name: str = "serve.log") -> Iterator[str]:
    """`codeyard serve` on SQLite in `data_dir` with the bwrap sandbox (or as `settings`, CODEYARD_*
    variables, say; None unsets one); yields its base URL."""
    port = free_port()
    # bwrap: runs start in well under a second and need no Docker daemon.
    # The LLM loads on first use unless `settings` say otherwise: benchmarks and tests that never ask it
    # should not share the CPU with a minute of loading.
    # One process unless `settings` say otherwise (the default is a worker per core): tests that kill, time or
    # read the log of "the server" mean one process; `serve --workers` has its own tests.
    env = {"CODEYARD_LLM_EAGER": "0", "CODEYARD_WORKERS": "1", **os.environ, "CODEYARD_DATA_DIR": str(data_dir), "CODEYARD_SANDBOX_BACKEND": "bwrap"}
    env.pop("CODEYARD_DATABASE_URL", None)
    for name, value in (settings or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    cli = [sys.executable, "-m", "ide_server.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = open(data_dir / log_name, "wb")
    proc = subprocess.Popen(cli, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # 60 s was seen to pass twice on a loaded host (other suites' model loads) with nothing wrong.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((data_dir / log_name).read_text())
            time.sleep(0.2)
        else:
            raise RuntimeError(f"codeyard serve did not become ready in {READY_TIMEOUT_S} s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
