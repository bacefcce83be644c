"""The install sandbox's only way out: an HTTPS CONNECT proxy, on a Unix socket, to the package index.

An install runs with no network of its own (fresh network namespace, loopback only). pip reaches
the index through a forwarder inside the sandbox and this proxy on the host, which tunnels to the
allowed hosts on port 443 and nothing else: not the host's loopback services, not the internet at
large. A hostile setup.py gets the same answer as pip for anything but the index.

The proxy runs on the machine the install runs on (`behind_index_proxy`, given the spec's `index_hosts`):
the server itself for a local backend, the runner node for the runners backend, so an install works on
a runner on another machine, which a Unix socket on the server could not reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from sandbox.backend import Mount, RunSpec
from sandbox.socket_relay import PIPE

PYPI_HOSTS = frozenset({"pypi.org", "files.pythonhosted.org"})
NPM_HOSTS = frozenset({"registry.npmjs.org"})
INDEX_HOSTS = PYPI_HOSTS | NPM_HOSTS  # all a spec's index_hosts may name (a runner refuses any other)
SOCKET_NAME = "proxy.sock"
PROXY_TARGET = "/run/codeyard-proxy"  # where the install sees the proxy's folder
MAX_HEAD = 8192

# Runs argv[2:] (with "{proxy}" replaced by the forwarder's URL) behind a loopback forwarder to the
# proxy's socket (argv[1]). umask 0: npm's cache is shared by installs running as different per-run uids.
FORWARD_AND_INSTALL = PIPE + r"""
import os, subprocess, sys, threading
def serve(listener):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try: upstream.connect(sys.argv[1])
        except OSError: client.close(); continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()
listener = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=serve, args=(listener,), daemon=True).start()
os.umask(0)
proxy = "http://127.0.0.1:%d" % listener.getsockname()[1]
sys.exit(subprocess.call([arg.replace("{proxy}", proxy) for arg in sys.argv[2:]]))
"""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class IndexProxy:
    """Serve CONNECT tunnels to `hosts`:443 on a Unix socket in a folder of its own, while in use."""

    def __init__(self, hosts: frozenset[str] = PYPI_HOSTS) -> None:
        self.hosts = hosts
        self.refused: list[str] = []  # what was asked for and not allowed, for the install's log
        self.folder: Path | None = None
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> IndexProxy:
        self.folder = Path(tempfile.mkdtemp(prefix="codeyard-proxy-"))
        os.chmod(self.folder, 0o755)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.folder / SOCKET_NAME))
        os.chmod(self.folder / SOCKET_NAME, 0o666)  # the install runs as a per-run uid
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self.folder is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        shutil.rmtree(self.folder, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            target = self._target(head[:MAX_HEAD])
            if target is None:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(target, 443), 30)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def _target(self, head: bytes) -> str | None:
        """The allowed host of a `CONNECT host:443` request, else None (and the request is noted)."""
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        host, _, port = parts[1].rpartition(":") if len(parts) == 3 else ("", "", "")
        if parts[:1] == ["CONNECT"] and port == "443" and host.lower() in self.hosts:
            return host.lower()
        self.refused.append(" ".join(parts)[:200])
        return None


@contextlib.asynccontextmanager
async def behind_index_proxy(spec: RunSpec) -> AsyncIterator[RunSpec]:
    """`spec` as this machine starts it: with index_hosts, its proxy serves while the run lasts, mounted at
    PROXY_TARGET, and the forwarder runs in front of argv; without, unchanged (no network at all)."""
    if not spec.index_hosts:
        yield spec
        return
    async with IndexProxy(spec.index_hosts) as proxy:
        assert proxy.folder is not None
        yield dataclasses.replace(spec, argv=["python3", "-c", FORWARD_AND_INSTALL, f"{PROXY_TARGET}/{SOCKET_NAME}",
                                              *spec.argv],
                                  mounts=(*spec.mounts, Mount(proxy.folder, PROXY_TARGET)), index_hosts=frozenset())
