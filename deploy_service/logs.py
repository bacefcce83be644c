"""A deployment's build and runtime log: kept on disk (bounded, rotated) and followed live.

Each entry is one JSON line {"type": "log", "release", "stream", "data", "time"}. The file
rotates to `<name>.1` past MAX_FILE_BYTES, so a deployment keeps at most twice that. Followers
(the logs WebSocket) get the kept tail first, then every new entry; a follower too slow to keep
up loses entries rather than holding the app back.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

MAX_FILE_BYTES = 1 << 20
MAX_ENTRY_CHARS = 8192
TAIL_ENTRIES = 500
FOLLOWER_QUEUE = 2000
FILE_POLL_SECONDS = 0.25
LogEntry = dict[str, Any]  # {"type": "log", "release", "stream", "data", "time"}, as the logs socket sends it


class DeployLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._followers: set[asyncio.Queue[LogEntry]] = set()

    def write(self, stream: str, data: str, release: str | None = None) -> None:
        """Keep and broadcast one entry (the text is cut to MAX_ENTRY_CHARS)."""
        if not data:
            return
        entry = {"type": "log", "release": release, "stream": stream, "data": data[:MAX_ENTRY_CHARS], "time": time.time()}
        line = json.dumps(entry) + "\n"
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)  # line-buffered: followers of the file see whole entries
        if self._file.tell() + len(line) > MAX_FILE_BYTES:
            self._file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._file = open(self.path, "a", buffering=1)
        self._file.write(line)
        for queue in self._followers:
            if queue.qsize() < FOLLOWER_QUEUE:
                queue.put_nowait(entry)

    def tail(self, entries: int = TAIL_ENTRIES) -> list[LogEntry]:
        """The newest kept entries, oldest first."""
        lines: list[str] = []
        for path in (self.path.with_name(self.path.name + ".1"), self.path):
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()
        kept = []
        for line in lines[-entries:]:
            try:
                kept.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a crash
        return kept

    def text(self, release: str | None = None, entries: int = 60) -> str:
        """The last entries (of one release) as plain text, for failure messages."""
        return "".join(e["data"] for e in self.tail() if release is None or e["release"] == release)[-entries * 120:]

    async def follow(self, from_file: bool = False) -> AsyncIterator[LogEntry]:
        """The kept tail, then new entries as they come (until the consumer stops). `from_file`: another
        replica writes this log (onto the shared data dir), so new entries are read as the file grows."""
        queue: asyncio.Queue[LogEntry] = asyncio.Queue()
        if from_file:  # (the size before the tail is read: nothing written in between is lost)
            new = self._file_growth(self.path.stat().st_size if self.path.exists() else 0)
        else:
            self._followers.add(queue)
            new = _drained(queue)
        try:
            last = 0.0
            for entry in self.tail():
                last = entry["time"]
                yield entry
            async for entry in new:
                if entry["time"] > last:  # written while the tail was read: already sent
                    yield entry
        finally:
            self._followers.discard(queue)

    async def _file_growth(self, offset: int) -> AsyncIterator[LogEntry]:
        """Entries appended to the file past offset, polled."""
        pending = b""
        while True:
            await asyncio.sleep(FILE_POLL_SECONDS)
            size = self.path.stat().st_size if self.path.exists() else 0
            if size < offset:  # rotated: the new file starts from nothing
                offset, pending = 0, b""
            if size == offset:
                continue
            with open(self.path, "rb") as file:
                file.seek(offset)
                pending += file.read(size - offset)
            offset = size
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        for path in (self.path, self.path.with_name(self.path.name + ".1")):
            path.unlink(missing_ok=True)


async def _drained(queue: asyncio.Queue[LogEntry]) -> AsyncIterator[LogEntry]:
    while True:
        yield await queue.get()
