"""A redis-server of a test's own on a unix socket, so no other test session's keys or streams mix in."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


class RedisServer:
    def __init__(self, folder: Path) -> None:
        self.folder, self.sock = folder, folder / "redis.sock"
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None

    def start(self, *, save: bool = False) -> RedisServer:
        """Start it (save: load the dump.rdb a SAVE left in the folder, as a restarted server does)."""
        self.sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(self.sock), "--appendonly", "no",
                                      "--dir", str(self.folder), *([] if save else ["--save", ""])],
                                     stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.sock.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
