"""One writer at a time per SQLite database, queued in Python instead of in SQLite's busy handler.

SQLite lets one connection write at a time; the others wait in its busy handler, which sleeps
1, 2, 5, ... up to 100 ms between tries and so notices a free lock late. Under a class's sign-ups
and saves, writers slept in turn while the lock sat free and the CPU idled (seconds per request).
Here a connection takes a WriterLock before its first writing statement and gives it back when
its transaction ends, so the next writer starts the moment the lock is free: a thread lock among
the process's own connections, then, for a database file, an flock on a file beside it among
processes (serve's workers share one database; between them SQLite's handler slept up to 100 ms
while the lock sat free). SQLite's own lock and busy timeout stay underneath.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self, cast

# Statements that take SQLite's write lock (in the default, deferred transactions of pysqlite).
WRITING = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


class _Writer(Protocol):
    """What a cursor and _Writing use of the WriterConnection below."""

    @property
    def in_transaction(self) -> bool: ...

    def writing(self, sql: str) -> _Writing: ...

    def take(self) -> None: ...

    def give_back(self) -> None: ...


def _writes(sql: str) -> bool:
    return sql.lstrip()[:7].upper().startswith(WRITING)


# How often a writer waiting on another process looks again: a try is one system call, and a
# write transaction here holds the lock for about a millisecond.
FILE_LOCK_POLL_S = (0.0002, 0.001)


class WriterLock:
    """The right to write to one SQLite database: first among this process's threads, then (with
    `file`) among processes, by an flock on that file."""

    def __init__(self, file: Path | None = None) -> None:
        self._threads = threading.Lock()
        self._file = file
        self._fd: int | None = None
        self._fd_pid = 0

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout=timeout):
            return False
        if self._file is None or self._lock_file(self._file, deadline):
            return True
        self._threads.release()
        return False

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def _lock_file(self, file: Path, deadline: float) -> bool:
        """Polls rather than blocks in flock, so that the wait stays bounded."""
        if self._fd is None or self._fd_pid != os.getpid():  # a forked child must not share the parent's flock
            self._fd, self._fd_pid = os.open(file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), os.getpid()
        pause, longest = FILE_LOCK_POLL_S
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(pause)
                pause = min(2 * pause, longest)


def connection_class(lock: WriterLock, wait_s: float) -> type[sqlite3.Connection]:
    """A sqlite3.Connection (pass as `factory=`) whose writers take `lock`, waiting at most wait_s."""

    class WriterCursor(sqlite3.Cursor):
        def execute(self, sql: str, parameters: Any = (), /) -> Self:
            with cast(_Writer, self.connection).writing(sql):  # a WriterConnection made this cursor
                return super().execute(sql, parameters)

        def executemany(self, sql: str, seq_of_parameters: Any, /) -> Self:
            with cast(_Writer, self.connection).writing(sql):
                return super().executemany(sql, seq_of_parameters)

    class WriterConnection(sqlite3.Connection):
        holds_lock = False

        def cursor(self, factory: Callable[[sqlite3.Connection], sqlite3.Cursor] = WriterCursor  # type: ignore[override]
                   ) -> sqlite3.Cursor:  # (sqlite3's overloads type the default factory None)
            return super().cursor(factory)

        def writing(self, sql: str) -> _Writing:
            return _Writing(self, _writes(sql))

        def take(self) -> None:
            if not self.holds_lock:
                if not lock.acquire(timeout=wait_s):
                    raise sqlite3.OperationalError("database is locked")
                self.holds_lock = True

        def give_back(self) -> None:
            if self.holds_lock:
                self.holds_lock = False
                lock.release()

        def commit(self) -> None:
            self._ending(super().commit)

        def rollback(self) -> None:
            self._ending(super().rollback)

        def close(self) -> None:
            self._ending(super().close)

        def _ending(self, end: Callable[[], None]) -> None:
            """The transaction ends (or the connection): the next writer may go, whatever happened."""
            try:
                end()
            finally:
                self.give_back()

    return WriterConnection


class _Writing:
    """Around one statement: take the lock first if it writes; if no transaction is left open
    afterwards (a failed statement, autocommit), give it back at once."""

    def __init__(self, conn: _Writer, writes: bool) -> None:
        self.conn, self.writes = conn, writes

    def __enter__(self) -> None:
        if self.writes:
            self.conn.take()

    def __exit__(self, *exc: object) -> None:
        if not self.conn.in_transaction:
            self.conn.give_back()
