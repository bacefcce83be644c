"""A run's Webview: the way in to a web app that a run started from the editor serves.

The run's network namespace stays empty, as for every run. Like a deployed app (deploy_service.instance),
the run gets a folder of its own mounted at /run/codeyard-preview, where a small bridge started in front
of the program listens on a unix socket and joins each connection to the port the program listens on,
which the server reads from /proc (sandbox.waiting.listening_ports) and writes into that folder. The
server's preview proxy (deploy_service.preview) is the only thing that opens the socket, for requests
under /preview/{token}/. Each member who watches the run gets a token of their own, so one member's
way in can be taken back (removed from the project) while the others' keep working.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import struct
from collections.abc import Callable

from sandbox.backend import PREFERRED_PORT, Mount
from sandbox.socket_relay import UNIX_TO_TCP
from sandbox.workspace import runs_root

PREVIEW_DIR = "/run/codeyard-preview"
SOCKET_NAME = "app.sock"
PORT_FILE = "port"

# Runs inside the sandbox: a grandchild (so the program never reaps it) listens on argv[1] and joins each
# connection to the port named in the file argv[2]; the first process then becomes the program (argv[4:]),
# so its pid, exit status, signals and input stay the program's own.
BRIDGE = UNIX_TO_TCP + r"""
import os, sys
path, port_file, argv = sys.argv[1], sys.argv[2], sys.argv[4:]
def port():
    try:
        with open(port_file) as f: return int(f.read())
    except (OSError, ValueError):
        return None
if os.fork() == 0:
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2): os.dup2(null, fd)
        serve_unix(path, port)
        threading.Event().wait()
    os._exit(0)
os.wait()
os.execvp(argv[0], argv)
"""


def preview_path(token: str) -> str:
    """Where a browser opens a Webview (under the IDE's own host)."""
    return f"/preview/{token}/"


class Preview:
    """One run's Webview: its folder on the host (socket and port file) and each watching member's secret."""

    def __init__(self, tag: str = "") -> None:
        """tag: what begins its tokens (Settings.worker_tag: which `serve --workers` worker runs it)."""
        self.tag = tag
        self._tokens: dict[str, str] = {}  # member's user id -> their token
        self._members: dict[str, str] = {}  # token -> the member's user id
        self._sockets: dict[str, set[Callable[[], object]]] = {}  # token -> how to end each WebSocket open with it
        self.folder = runs_root() / f"preview-{secrets.token_hex(8)}"
        self.folder.mkdir(mode=0o700)
        self.socket_path = str(self.folder / SOCKET_NAME)
        self._port: int | None = None

    def token_for(self, user_id: str) -> str:
        """The member's own secret (the same each time they ask)."""
        if (token := self._tokens.get(user_id)) is None:
            token = self._tokens[user_id] = self.tag + secrets.token_urlsafe(24)
            self._members[token] = user_id
        return token

    def user_of(self, token: str) -> str | None:
        return self._members.get(token)

    def revoke(self, user_id: str) -> str | None:
        """Take the member's token back and end the WebSockets they opened with it; the token, if they had one."""
        token = self._tokens.pop(user_id, None)
        if token is not None:
            del self._members[token]
            for end in self._sockets.pop(token, set()):
                end()
        return token

    def hold(self, token: str, end: Callable[[], object]) -> Callable[[], None]:
        """Remember how to end a WebSocket opened with `token` (revoke calls it); returns what forgets it."""
        self._sockets.setdefault(token, set()).add(end)
        return lambda: self._sockets.get(token, set()).discard(end)

    def mount(self) -> Mount:
        return Mount(self.folder, PREVIEW_DIR, writable=True, owned_by_run=True)

    def wrapper(self) -> tuple[str, ...]:
        """What runs in front of the program (RunSpec.wrapper): the bridge, which then execs it."""
        return ("python3", "-c", BRIDGE, f"{PREVIEW_DIR}/{SOCKET_NAME}", f"{PREVIEW_DIR}/{PORT_FILE}", "--")

    def environment(self) -> dict[str, str]:
        return {"PORT": str(PREFERRED_PORT)}

    def point_at(self, port: int) -> None:
        """Send the bridge's next connections to `port` (where the program listens now).

        The folder is the run's: whatever name it holds may be a symlink the program planted, so the
        server writes a fresh file (O_EXCL never follows one) and renames it over (a rename never follows)."""
        if port == self._port:
            return
        temporary = self.folder / f".{PORT_FILE}-{secrets.token_hex(8)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, str(port).encode())
        finally:
            os.close(fd)
        os.replace(temporary, self.folder / PORT_FILE)
        self._port = port

    async def connect(self) -> socket.socket:
        """A connection to the bridge, checked to be the run's own: the socket's name may be a symlink the
        program planted to a host socket, so the listener must be the run's uid (the owner of its folder)."""
        owner = os.stat(self.folder).st_uid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.socket_path)
            _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if owner == 0 or uid != owner:
                raise ConnectionRefusedError(f"the preview socket is not the run's own (listener uid {uid})")
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
