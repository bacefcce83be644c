"""The project file behind a room: written soon after edits, watched for changes made elsewhere.

Writes are debounced (0.6 s after the last edit, at most `max_delay_s` after the first unsaved
one) and atomic (temp file + os.replace), so runs, deploys and git never see half a file. Runs,
checkpoints and deploys flush the project's rooms first, so the delay only shows in a Shell. Each
write costs two database writes, a thread hop and the whole text: at a 0.3 s debounce a class
typing every half second wrote every file after every keystroke, a fifth of the server's CPU
(0.6 s and 3 s: a sixth as many writes; the file still follows within a second of the last edit).
No fsync: the file is a copy of the stored document, which a restart writes out again if the file
is behind it (`Room.reconcile_disk`); fsyncing every write kept the kernel's ext4 workers at half
a core under a class of 100. A change on disk that we did not
write is handed to the room together with the document state that was last written (the
base), so the room can rebase the outside edit onto everything typed since.

With several replicas only one, the disk owner, writes and watches a file; otherwise each would
take the others' writes for outside edits and apply them twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

FileStamp = tuple[int, int, int]  # inode, size, mtime_ns
OWNER_CHECK_S = 1.0
WRITE_ATTEMPTS = 3
ACTIVE_S = 10.0  # how long after an edit (ours or on disk) the file is polled at the fast rate


class DiskHost(Protocol):
    """What the mirror needs from its room."""

    def snapshot(self) -> tuple[str, bytes]:
        """The current text and the full document state it belongs to."""

    async def merge_outside_change(self, base_text: str, base_state: bytes, new_text: str) -> bytes:
        """Merge the edit; returns the document state that the file's text now corresponds to."""

    def mark_writing(self, text: str) -> Future[None]:
        """Record, before the write, that `text` is about to be written (done when committed)."""

    def mark_written(self, text: str) -> Future[None]:
        """Record that the file now holds `text` (done when committed)."""

    async def owns_disk(self) -> bool: ...

    async def reconcile_disk(self) -> None:
        """Bring document and file together after taking over the file (adopting what is there)."""


def read_text(path: Path) -> str:
    """The file's text; ValueError when it is not UTF-8 (binary files have no room)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"file_path: {path.name} is not a UTF-8 text file") from exc


class ChangedMeanwhile(Exception):
    """The file changed after we last looked: merge that change before writing."""


def write_text_atomic(path: Path, text: str, expected: FileStamp | None) -> None:
    """Write through a temp file and rename, only if the file is still as we last saw it (`expected`,
    None for "no file"), so a save that lands while we write is not overwritten."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".codeyard-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        if file_stamp(path) != expected:
            raise ChangedMeanwhile(str(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def _to_the_end(step: Coroutine[Any, Any, None]) -> None:
    """Run step to its end even if the caller is cancelled (a room closing stops its mirror task).

    A write cut off between the file's rename and recording its stamp and text would make the
    next look take our own write for an outside edit and merge it again: duplicated lines.
    """
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_log_failure)  # nobody awaits it any more
        raise


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("disk mirror step failed after its caller left", exc_info=task.exception())


def file_stamp(path: Path) -> FileStamp | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class DiskMirror:
    """Runs one task per open room: debounced writes of the document and polling for outside edits."""

    def __init__(
        self,
        path: Path,
        host: DiskHost,
        *,
        debounce_s: float = 0.6,
        max_delay_s: float = 3.0,
        poll_s: float = 0.5,
        idle_poll_s: float = 2.0,
    ) -> None:
        self.path = path
        self.host = host
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.poll_s, self.idle_poll_s = poll_s, idle_poll_s
        # Until then the file is looked at every poll_s; after a quiet while, every idle_poll_s:
        # a class's hundreds of open rooms each checking their file 4 times a second kept the event
        # loop busy. Writers we know of (the files API, runs) call check_now at once anyway.
        self._active_until = 0.0
        self.written_text: str | None = None
        self.written_state = b""
        self.owner = False
        self._owner_checked = 0.0
        self._stamp: FileStamp | None = None
        self._first_dirty: float | None = None
        self._last_dirty = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._io_lock = asyncio.Lock()

    def adopt(self, disk_text: str, disk_state: bytes) -> None:
        """Record what the file holds now and the document state it belongs to (the merge base)."""
        self.written_text = disk_text
        self.written_state = disk_state
        self._stamp = file_stamp(self.path)
        self.owner = True
        self._owner_checked = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"disk-mirror:{self.path}")

    async def stop(self, *, flush: bool = True) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if flush and self.owner:
            await self.flush()

    def mark_dirty(self) -> None:
        now = time.monotonic()
        self._active_until = now + ACTIVE_S
        self._last_dirty = now
        if self._first_dirty is None:
            self._first_dirty = now
        self._wake.set()

    async def flush(self) -> None:
        """Write the document now if it changed since the last write.

        A change made on disk since the last look is merged first, so a write never overwrites it;
        one that lands while we write is merged and the write made again.
        """
        await _to_the_end(self._flush())

    async def _flush(self) -> None:
        async with self._io_lock:
            self._first_dirty = None
            for _ in range(WRITE_ATTEMPTS):
                try:
                    await self._merge_outside_change()
                except ValueError:
                    log.warning("%s is no longer UTF-8 text: the document replaces it", self.path)
                text, state = self.host.snapshot()
                if text != self.written_text:
                    try:
                        self._stamp = await asyncio.to_thread(self._write_recorded, text, self._stamp)
                    except ChangedMeanwhile:
                        continue
                self.written_text, self.written_state = text, state
                return
            self.mark_dirty()  # outside writes kept racing ours: try again on the next round

    def _write_recorded(self, text: str, expected: FileStamp | None) -> FileStamp | None:
        """In a worker thread, the write and its two records in one hop: each hop back to a busy
        event loop cost a turn of it, and a run waits for these writes."""
        self.host.mark_writing(text).result()
        write_text_atomic(self.path, text, expected)
        stamp = file_stamp(self.path)
        self.host.mark_written(text).result()
        return stamp

    async def _run(self) -> None:
        while True:
            if not await self._still_owner():
                self._first_dirty = None
                await asyncio.sleep(self.poll_s)
                continue
            timeout = self.poll_s if time.monotonic() < self._active_until else self.idle_poll_s
            if self._first_dirty is not None:
                now = time.monotonic()
                due = min(self._last_dirty + self.debounce_s, self._first_dirty + self.max_delay_s)
                if due <= now:
                    await self._guarded(self.flush)
                    continue
                timeout = min(timeout, due - now)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                await self._guarded(self.check_now)

    async def _still_owner(self) -> bool:
        if time.monotonic() - self._owner_checked < OWNER_CHECK_S:
            return self.owner
        was_owner = self.owner
        try:
            self.owner = await self.host.owns_disk()
        except Exception:
            log.exception("could not check who owns %s", self.path)
            self.owner = False
        self._owner_checked = time.monotonic()
        if self.owner and not was_owner:
            await self._guarded(lambda: _to_the_end(self._reconcile()))
        return self.owner

    async def _reconcile(self) -> None:
        async with self._io_lock:
            await self.host.reconcile_disk()

    async def _guarded(self, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except Exception:
            log.exception("disk mirror of %s failed; retrying", self.path)
            await asyncio.sleep(self.poll_s)

    async def check_now(self) -> None:
        """Merge a change made on disk now instead of at the next poll (the files API wrote it)."""
        await _to_the_end(self._check_now())

    async def _check_now(self) -> None:
        async with self._io_lock:
            await self._merge_outside_change()

    async def _merge_outside_change(self) -> None:
        """Hand a change on disk that we did not write to the room (call with the io lock held)."""
        stamp = file_stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp  # even if it is not text: the document then replaces it (see flush)
        self._active_until = time.monotonic() + ACTIVE_S
        text = await asyncio.to_thread(read_text, self.path)
        if text == self.written_text:
            return
        # The file's new text is the base of the next outside edit: keeping the old base made a
        # second quick edit (two saves, a program writing twice) re-apply the first one.
        self.written_state = await self.host.merge_outside_change(self.written_text or "", self.written_state, text)
        self.written_text = text
