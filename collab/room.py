"""One open file: its CRDT document, the clients editing it, their presence, storage and disk copy.

Every document change goes through one path: applied to the doc and sent to the room's other
clients at once (as y-websocket does), then stored durably by the flush task (one transaction per
batch), and only then sent to other replicas, the file on disk and history.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pycrdt import Doc, Text, TransactionEvent, merge_updates
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from collab.disk import DiskMirror, read_text
from collab.presence import Presence
from collab.protocol import (
    AwarenessEntry,
    ProtocolError,
    encode_awareness,
    encode_sync_step1,
    encode_sync_step2,
    encode_sync_update,
)
from collab.store import UpdateStore
from collab.textdiff import apply_text

log = logging.getLogger(__name__)

TEXT_NAME = "content"
EMPTY_STATE = b"\x00"  # the state vector of a document nobody has written to
CLOSE_STORE_FAILED = 1011
STORE_ATTEMPTS = 5  # waits of 0.2 + 0.4 + 0.6 + 0.8 s between them, after each attempt's own wait
STORE_RETRY_S = 0.2


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RoomKey:
    project_id: str
    file_path: str

    @property
    def name(self) -> str:
        return f"{self.project_id}/{self.file_path}"


class Peer(Protocol):
    """What a room needs from a connected client (see collab.connection)."""

    user_id: str
    awareness_ids: set[int]

    def enqueue(self, message: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class Publisher(Protocol):
    """Where a room sends stored updates and presence for other replicas (see collab.fanout)."""

    async def publish_update(self, room: str, update: bytes) -> None: ...

    async def publish_awareness(self, room: str, entries: list[AwarenessEntry]) -> None: ...

    async def claim_disk(self, room: str) -> bool:
        """Take or renew this replica's turn as the only one writing the room's file."""

    async def release_disk(self, room: str) -> None: ...


class Room:
    def __init__(
        self,
        key: RoomKey,
        path: Path,
        store: UpdateStore,
        publisher: Publisher | None = None,
        *,
        compact_every: int = 500,
        on_edit: Callable[[RoomKey, str], None] | None = None,
    ) -> None:
        self.key = key
        self.on_edit = on_edit
        self.store = store
        self.publisher = publisher
        self.compact_every = compact_every
        self.doc: Doc[Text] = Doc()
        self.text = self.doc.get(TEXT_NAME, type=Text)
        self.peers: set[Peer] = set()
        self.presence = Presence()
        self.holders = 0
        self.closed = False
        self.mirror = DiskMirror(path, self)
        self._captured: list[bytes] = []
        self._pending: list[tuple[bytes, Peer | None]] = []
        self._queued = 0
        self._stored = 0
        self._stored_changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._log_rows = 0
        self._compacting: asyncio.Task[bool] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._loaded = False
        self._remote_backlog: list[bytes] = []
        self.doc.observe(self._capture)

    # ---- lifecycle -------------------------------------------------------------------------

    async def load(self) -> None:
        """Restore the document from storage; the file seeds it only when nothing is stored.

        Rebuilding from stored updates (never re-inserting the file text) keeps the CRDT item ids
        that reconnecting clients already hold, so their copies merge without duplicates.
        """
        if not self.mirror.path.is_file():
            raise FileNotFoundError(f"file_path: {self.key.file_path} does not exist")
        await asyncio.to_thread(read_text, self.mirror.path)  # refuse binary files early
        stored = await asyncio.to_thread(self.store.load, self.key.name)
        self._log_rows = len(stored)
        with self.doc.transaction(origin="store"):
            for update in stored:
                self.doc.apply_update(update)
        self._captured.clear()
        for update in self._remote_backlog:
            self.doc.apply_update(update)
        self._captured.clear()
        self._remote_backlog.clear()
        self._loaded = True
        self._flusher = asyncio.create_task(self._flush_loop(), name=f"room-flush:{self.key.name}")
        if await self.owns_disk():
            await self.reconcile_disk()
        self.mirror.start()

    async def reconcile_disk(self) -> None:
        """Called by the disk owner on load (or takeover): seed, merge or catch up the file.

        The document is judged as it was before reading the file: edits arriving meanwhile (a
        client typing, another replica's update) are kept by rebasing the file's change onto
        them. Replacing the whole text with the file's erased such an edit when it landed
        during the reads (seen with rooms opening together on two replicas)."""
        base_text, base_state, first_open = str(self.text), self.doc.get_update(), self.doc.get_state() == EMPTY_STATE
        disk_text = await asyncio.to_thread(read_text, self.mirror.path)
        disk_state = base_state
        if base_text != disk_text:
            written = await asyncio.to_thread(self.store.written_hashes, self.key.name)
            if first_open or sha256_text(disk_text) not in written:
                # First open, or someone changed the file while the room was closed.
                disk_state = await self.merge_outside_change(base_text, base_state, disk_text)
            # Otherwise the file is merely behind the stored document (the writer stopped
            # before writing it): the document wins and is written by the mirror.
        self.mirror.adopt(disk_text, disk_state)
        if str(self.text) == disk_text:
            await asyncio.wrap_future(self.mark_written(disk_text))
        else:
            self.mirror.mark_dirty()

    async def unload(self, *, keep: bool = True) -> None:
        """Stop the room's tasks after storing everything; with keep, also write disk and compact."""
        await self.mirror.stop(flush=keep)  # its last write may first merge a change made on disk
        await self.wait_stored()
        if self._flusher:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self._compacting:
            await asyncio.gather(self._compacting, return_exceptions=True)
        if keep and self._log_rows > 1:
            await asyncio.to_thread(self.store.compact, self.key.name)
        if self.publisher and self.mirror.owner:
            await self.publisher.release_disk(self.key.name)
        self.closed = True

    # ---- clients ---------------------------------------------------------------------------

    def join(self, peer: Peer) -> None:
        """Start the sync handshake and show the newcomer everyone's presence."""
        self.peers.add(peer)
        peer.enqueue(encode_sync_step1(self.doc.get_state()))
        current = self.presence.current()
        if current:
            peer.enqueue(encode_awareness(current))

    async def leave(self, peer: Peer) -> None:
        """Remove the peer and, at once, the presence states it announced."""
        self.peers.discard(peer)
        removals = self.presence.remove(peer.awareness_ids)
        peer.awareness_ids.clear()
        if removals:
            self._send_all(encode_awareness(removals))
            if self.publisher:
                await self.publisher.publish_awareness(self.key.name, removals)

    async def sync_reply(self, state_vector: bytes) -> bytes:
        """Sync step 2 for a client's step 1, once everything it will receive is stored."""
        await self.wait_stored()
        try:
            return encode_sync_step2(self.doc.get_update(state_vector))
        except ValueError as exc:
            raise ProtocolError(f"bad state vector: {exc}") from exc

    def receive_update(self, update: bytes, origin: Peer | None) -> None:
        """Apply a client's update and send it to the room's other clients; the flush task stores it."""
        try:
            self.doc.apply_update(update)
        except ValueError as exc:
            self._captured.clear()
            raise ProtocolError(f"bad document update: {exc}") from exc
        self._queue_captured(origin)

    async def receive_awareness(self, entries: tuple[AwarenessEntry, ...], origin: Peer) -> None:
        # A client may not change or remove the presence another connection announced.
        others = set().union(*(peer.awareness_ids for peer in self.peers if peer is not origin))
        accepted = self.presence.apply([entry for entry in entries if entry.client_id not in others])
        if not accepted:
            return
        for entry in accepted:
            if entry.state_json == "null":
                origin.awareness_ids.discard(entry.client_id)
            else:
                origin.awareness_ids.add(entry.client_id)
        self._send_all(encode_awareness(accepted), skip=origin)
        if self.publisher:
            await self.publisher.publish_awareness(self.key.name, accepted)

    def presence_message(self) -> bytes:
        return encode_awareness(self.presence.current())

    def local_presence(self) -> list[AwarenessEntry]:
        """States announced by this replica's own clients (what another replica asks for)."""
        local_ids = set().union(*(peer.awareness_ids for peer in self.peers))
        return [entry for entry in self.presence.current() if entry.client_id in local_ids]

    # ---- other replicas (already stored by them) -------------------------------------------

    def receive_remote_update(self, update: bytes) -> None:
        if not self._loaded:
            self._remote_backlog.append(update)
            return
        self.doc.apply_update(update)
        changes, self._captured = self._captured, []
        if changes:
            self._send_all(encode_sync_update(_merged(changes)))
            self.mirror.mark_dirty()

    def receive_remote_awareness(self, entries: list[AwarenessEntry]) -> None:
        accepted = self.presence.apply(entries)
        if accepted:
            self._send_all(encode_awareness(accepted))

    # ---- edits made outside the editor -----------------------------------------------------

    async def set_text(self, new_text: str) -> None:
        """Make the document read new_text (files API, history restore) as a minimal edit."""
        self._edit_text(new_text)
        await self.wait_stored()

    async def merge_outside_change(self, base_text: str, base_state: bytes, new_text: str) -> bytes:
        """Rebase a disk edit made against base_state onto the current document.

        The diff base_text -> new_text is applied to a copy of the document as it was when the
        file was last written, and that copy's update is merged in: edits typed meanwhile stay.
        The diff runs in a worker thread (a large file's diff must not stall every other room).
        Returns the state the file's text now belongs to: the merge base of the next outside edit.
        """
        rebased = await asyncio.to_thread(_rebase, base_state, base_text, new_text)
        if rebased is None:
            self._edit_text(new_text)
            new_base = self.doc.get_update()
        else:
            update, new_base = rebased
            self.receive_update(update, origin=None)
        await self.wait_stored()
        return new_base

    def _edit_text(self, new_text: str) -> None:
        with self.doc.transaction(origin="server"):
            apply_text(self.text, new_text)
        self._queue_captured(None)

    # ---- storage, broadcast -----------------------------------------------------------------

    def _capture(self, event: TransactionEvent) -> None:
        self._captured.append(event.update)

    def _queue_captured(self, origin: Peer | None) -> None:
        """Send the captured changes to every client but their origin, and queue them for storing.

        Sending does not wait for the commit: under a class's load the writer's commit took up to a
        third of a second, and every keystroke waited for it. Nothing is lost by not waiting: Yjs
        clients keep every update they have seen and hand back what the server lacks when they
        reconnect, so if storing fails (the room closes, see _fail) the edit returns with them."""
        changes, self._captured = self._captured, []
        if not changes:
            return
        self._send_all(encode_sync_update(_merged(changes)), skip=origin)
        for update in changes:
            self._pending.append((update, origin))
            self._queued += 1
        self._wake.set()

    async def wait_stored(self) -> None:
        target = self._queued
        async with self._stored_changed:
            await self._stored_changed.wait_for(lambda: self._stored >= target or self.closed)

    # ---- the file on disk (see collab.disk.DiskHost) -----------------------------------------

    def snapshot(self) -> tuple[str, bytes]:
        return str(self.text), self.doc.get_update()

    def mark_writing(self, text: str) -> Future[None]:
        return self.store.mark_writing(self.key.name, sha256_text(text))

    def mark_written(self, text: str) -> Future[None]:
        return self.store.mark_written(self.key.name, sha256_text(text))

    async def owns_disk(self) -> bool:
        return self.publisher is None or await self.publisher.claim_disk(self.key.name)

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            updates = [update for update, _ in batch]
            if not await self._store(updates):
                await self._fail()
                return
            self.mirror.mark_dirty()
            if self.on_edit:
                for user_id in {peer.user_id for _, peer in batch if peer is not None}:
                    self.on_edit(self.key, user_id)
            self._log_rows += len(updates)
            async with self._stored_changed:
                self._stored += len(batch)
                self._stored_changed.notify_all()
            if self.publisher:
                await self.publisher.publish_update(self.key.name, _merged(updates))
            self._maybe_compact()

    async def _store(self, updates: list[bytes]) -> bool:
        """Append to the update log, retrying a busy database (no pooled connection, SQLite's write
        lock) for a while: closing the room drops every editor of the file."""
        for attempt in range(STORE_ATTEMPTS):
            try:
                await asyncio.wrap_future(self.store.append(self.key.name, updates))
                return True
            except (SQLAlchemyTimeoutError, OperationalError):
                if attempt + 1 == STORE_ATTEMPTS:
                    break
                log.warning("storing updates of %s failed (attempt %d); retrying", self.key.name, attempt + 1)
                await asyncio.sleep(STORE_RETRY_S * (attempt + 1))
            except Exception:
                break
        log.exception("storing updates of %s failed; closing the room", self.key.name)
        return False

    def _maybe_compact(self) -> None:
        if self._log_rows >= self.compact_every and (self._compacting is None or self._compacting.done()):
            self._log_rows = 0
            self._compacting = asyncio.create_task(asyncio.to_thread(self.store.compact, self.key.name))

    async def _fail(self) -> None:
        """Storage failed: drop the in-memory state; clients resend their edits on reconnect."""
        self.closed = True
        async with self._stored_changed:
            self._stored_changed.notify_all()
        await self.mirror.stop(flush=False)
        for peer in list(self.peers):
            await peer.close(CLOSE_STORE_FAILED, "storage unavailable")

    def _send_all(self, message: bytes, skip: Peer | None = None) -> None:
        for peer in self.peers:
            if peer is not skip:
                peer.enqueue(message)


def _merged(updates: list[bytes]) -> bytes:
    """One update carrying them all (the one itself when alone: merging costs a decode and encode)."""
    return updates[0] if len(updates) == 1 else merge_updates(*updates)


def _rebase(base_state: bytes, base_text: str, new_text: str) -> tuple[bytes, bytes] | None:
    """(the update that turns base into new_text, the resulting state), or None when base_state
    does not read base_text. Works on a document of its own, so it may run in any thread."""
    base: Doc[Text] = Doc()
    content = base.get(TEXT_NAME, type=Text)
    base.apply_update(base_state)
    if str(content) != base_text:
        return None
    before = base.get_state()
    with base.transaction():
        apply_text(content, new_text)
    return base.get_update(before), base.get_update()
