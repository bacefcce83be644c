"""Durable CRDT state per room: an append-only update log plus one compacted snapshot.

A room's document is the merge of its snapshot and every logged update, so restarts restore the
exact CRDT items clients already hold (which is what prevents duplicated text on reconnect).
Blocking SQLAlchemy calls; the async side runs them in a worker thread. The tables belong to
the app's metadata (ide_server.db.MODEL_MODULES) and are created by the Alembic migrations.

The frequent small writes (every room's edits, and the hash of each text written to disk) go
through one writer thread that commits whatever is waiting in one transaction, the way
Datasette serialises writes: a class typing at once made hundreds of tiny transactions a second,
and on SQLite each waited its turn for the one write lock in the busy handler's sleeps.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime

from pycrdt import merge_updates
from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Index,
    Integer,
    LargeBinary,
    String,
    Update,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from ide_server.db import Base

ROOM_KEY_LENGTH = 1024
# Integer primary keys autoincrement on SQLite only when declared INTEGER.
LogId = BigInteger().with_variant(Integer, "sqlite")
WRITER_IDLE_S = 5.0  # the writer thread ends after this long without work (and starts again on demand)
WRITES_PER_TRANSACTION = 500

Write = Callable[[Connection], None]


class DocUpdate(Base):
    __tablename__ = "collab_doc_updates"
    # AUTOINCREMENT: SQLite would otherwise reuse the id of a deleted last row, and a compaction
    # deleting the ids it merged could then delete a newer update that took one of them.
    __table_args__ = (Index("ix_collab_doc_updates_room_id", "room", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(LogId, primary_key=True, autoincrement=True)
    room: Mapped[str] = mapped_column(String(ROOM_KEY_LENGTH))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DocSnapshot(Base):
    __tablename__ = "collab_doc_snapshots"

    room: Mapped[str] = mapped_column(String(ROOM_KEY_LENGTH), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    # Bumped by every compaction, so two processes compacting at once cannot both win.
    version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class WrittenFile(Base):
    """What the server last wrote to a room's file, to tell a stale file from an edited one."""

    __tablename__ = "collab_written_files"

    room: Mapped[str] = mapped_column(String(ROOM_KEY_LENGTH), primary_key=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Set before a write starts: a crash mid-write leaves either the old or this text on disk.
    pending_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


# Built once: the writer thread runs these for every typing room, and composing a statement
# costs more CPU than running it.
_APPEND = insert(DocUpdate)
_MARK_WRITING = (
    update(WrittenFile)
    .where(WrittenFile.room == bindparam("key"))
    .values(pending_sha256=bindparam("pending"), updated_at=bindparam("at"))
)
_MARK_WRITTEN = (
    update(WrittenFile)
    .where(WrittenFile.room == bindparam("key"))
    .values(sha256=bindparam("sha"), pending_sha256=None, updated_at=bindparam("at"))
)


class UpdateStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._writes: queue.SimpleQueue[tuple[Write, Future[None]]] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()

    def append(self, room: str, updates: list[bytes]) -> Future[None]:
        """Store updates; the future completes once they are committed (or fails with the error)."""
        now = datetime.now(UTC)
        rows = [{"room": room, "data": data, "created_at": now} for data in updates]

        def append(conn: Connection) -> None:
            if rows:
                conn.execute(_APPEND, rows)

        return self._write(append)

    def _write(self, write: Write) -> Future[None]:
        """Queue `write` for the writer thread's next transaction; the future completes at its commit.

        Callers wait on the future, not in a thread: an event loop awaits it (asyncio.wrap_future)
        without holding a worker thread. A class's hundreds of rooms each parked a thread here
        while the writer committed, and the loop's other file and git work queued behind them."""
        done: Future[None] = Future()
        self._writes.put((write, done))
        with self._writer_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_forever, name="collab-store-writer", daemon=True)
                self._writer.start()
        return done

    def _write_forever(self) -> None:
        while True:
            try:
                batch = [self._writes.get(timeout=WRITER_IDLE_S)]
            except queue.Empty:
                with self._writer_lock:
                    if self._writes.empty():
                        self._writer = None
                        return
                continue
            while len(batch) < WRITES_PER_TRANSACTION:
                try:
                    batch.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            self._commit(batch)

    def _commit(self, batch: list[tuple[Write, Future[None]]]) -> None:
        """All of the batch in one transaction; if that fails, each alone, so one bad write fails only itself."""
        try:
            with self.engine.begin() as conn:
                for write, _ in batch:
                    write(conn)
        except Exception as exc:
            if len(batch) > 1:
                for one in batch:
                    self._commit([one])
                return
            batch[0][1].set_exception(exc)
            return
        for _, done in batch:
            done.set_result(None)

    def load(self, room: str) -> list[bytes]:
        """The snapshot (if any) followed by the logged updates.

        The log is read before the snapshot: a compaction committing in between only moves rows
        into the snapshot, so nothing can fall between the two reads (updates are idempotent).
        """
        with self.engine.connect() as conn:
            log = conn.execute(
                select(DocUpdate.data).where(DocUpdate.room == room).order_by(DocUpdate.id)
            ).scalars().all()
            snapshot = conn.execute(
                select(DocSnapshot.data).where(DocSnapshot.room == room)
            ).scalar_one_or_none()
        return ([snapshot] if snapshot is not None else []) + list(log)

    def log_length(self, room: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(
                select(func.count()).select_from(DocUpdate).where(DocUpdate.room == room)
            ).scalar_one()

    def compact(self, room: str) -> bool:
        """Merge the log into the snapshot. Returns False when another process compacted first."""
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(DocUpdate.id, DocUpdate.data).where(DocUpdate.room == room).order_by(DocUpdate.id)
            ).all()
            if not rows:
                return True
            current = conn.execute(
                select(DocSnapshot.data, DocSnapshot.version).where(DocSnapshot.room == room)
            ).one_or_none()
            parts = ([current.data] if current else []) + [row.data for row in rows]
            version = current.version + 1 if current else 1
            values = {"data": merge_updates(*parts), "version": version, "updated_at": datetime.now(UTC)}
            if current is None:
                try:
                    with conn.begin_nested():
                        conn.execute(insert(DocSnapshot).values(room=room, **values))
                except IntegrityError:
                    return False
            else:
                swapped = conn.execute(
                    update(DocSnapshot)
                    .where(DocSnapshot.room == room, DocSnapshot.version == current.version)
                    .values(**values)
                )
                if swapped.rowcount != 1:
                    return False
            # Delete exactly the rows merged: ids from a sequence may commit out of order.
            merged_ids = [row.id for row in rows]
            for start in range(0, len(merged_ids), 500):
                conn.execute(delete(DocUpdate).where(DocUpdate.id.in_(merged_ids[start : start + 500])))
        return True

    def mark_writing(self, room: str, sha256: str) -> Future[None]:
        return self._set_written(room, _MARK_WRITING, pending_sha256=sha256)

    def mark_written(self, room: str, sha256: str) -> Future[None]:
        return self._set_written(room, _MARK_WRITTEN, sha256=sha256, pending_sha256=None)

    def written_hashes(self, room: str) -> set[str]:
        """Hashes of texts the server wrote (or was writing) to the room's file."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(WrittenFile.sha256, WrittenFile.pending_sha256).where(WrittenFile.room == room)
            ).one_or_none()
        return {value for value in (row or ()) if value}

    def _set_written(self, room: str, prepared: Update, **hashes: str | None) -> Future[None]:
        """Upsert the room's hashes: `prepared` (built once, like every typing room's writes need)
        updates the row; the first write of a room inserts it."""
        now = datetime.now(UTC)

        def upsert(conn: Connection) -> None:
            params = {"key": room, "at": now, "sha": hashes.get("sha256"), "pending": hashes.get("pending_sha256")}
            if conn.execute(prepared, params).rowcount:
                return
            try:
                with conn.begin_nested():
                    conn.execute(insert(WrittenFile).values(room=room, updated_at=now, **hashes))
            except IntegrityError:
                conn.execute(prepared, params)

        return self._write(upsert)

    def delete(self, room: str) -> None:
        """Forget a room's document (its file was deleted)."""
        with self.engine.begin() as conn:
            for table in (DocUpdate, DocSnapshot, WrittenFile):
                conn.execute(delete(table).where(table.room == room))
