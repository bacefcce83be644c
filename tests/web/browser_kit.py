"""`codeyard serve` as a subprocess and Debian's Chromium flags (shared by the browser tests and benchmarks/web_bench.py)."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def codeyard_serve(data_dir: Path) -> Iterator[str]:
    """`codeyard serve` on SQLite in `data_dir` with the bwrap sandbox; yields its base URL."""
    port = free_port()
    # bwrap: runs start in well under a second and need no Docker daemon.
    env = {**os.environ, "CODEYARD_DATA_DIR": str(data_dir), "CODEYARD_SANDBOX_BACKEND": "bwrap"}
    env.pop("CODEYARD_DATABASE_URL", None)
    cli = [sys.executable, "-m", "ide_server.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = open(data_dir / "serve.log", "wb")
    proc = subprocess.Popen(cli, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((data_dir / "serve.log").read_text())
            time.sleep(0.2)
        else:
            raise RuntimeError("codeyard serve did not become ready in 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


PASSWORD = "correct horse battery"


def api_client(server_url: str, username: str, register: bool = True) -> httpx.Client:
    """An HTTP client signed in as username (registered first unless register=False), with its CSRF header set."""
    client = httpx.Client(base_url=server_url, timeout=30)
    if register:
        client.post("/api/auth/register", json={"username": username, "password": PASSWORD}).raise_for_status()
    client.post("/api/auth/login", json={"username": username, "password": PASSWORD}).raise_for_status()
    client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
    return client


def editor_text(page) -> str:
    """The open file's text as the document holds it: no cursor labels of other people, no ghost text."""
    return page.evaluate("""() => {
        const host = [...document.querySelectorAll('.editor-host')].find((el) => !el.hidden);
        return [...host.querySelectorAll('.cm-line')].map((line) => {
            const copy = line.cloneNode(true);
            copy.querySelectorAll('.cm-ySelectionCaret, .cm-ghost-text').forEach((el) => el.remove());
            return copy.textContent.replaceAll('\\u2060', '');
        }).join('\\n');
    }""")


def signed_in_context(browser, server_url: str, username: str, *, register: bool = False,
                      width: int = 1280, height: int = 720):
    """A browser context (its own cookies) signed in as username, registered first if register=True."""
    context = browser.new_context(viewport={"width": width, "height": height})
    credentials = {"username": username, "password": PASSWORD}
    if register:
        context.request.post(server_url + "/api/auth/register", data=credentials)
    context.request.post(server_url + "/api/auth/login", data=credentials)
    return context
