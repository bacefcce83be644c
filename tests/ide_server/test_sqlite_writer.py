"""SQLite writers queue on a lock in the process, not in SQLite's sleeping busy handler (issue 25)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ide_server import db

WRITERS = 40


@pytest.fixture
def engine(tmp_path: Path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE counts (writer INTEGER, n INTEGER)"))
    yield engine
    engine.dispose()


def test_many_writers_at_once_all_commit_without_a_lock_error(engine) -> None:
    errors: list[Exception] = []

    def write(writer: int) -> None:
        try:
            for n in range(20):
                with engine.begin() as conn:
                    conn.execute(text("INSERT INTO counts VALUES (:w, :n)"), {"w": writer, "n": n})
                    time.sleep(0.001)  # a transaction doing a little work while it holds the lock
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM counts")).scalar() == WRITERS * 20


def test_the_lock_is_given_back_by_commit_rollback_and_a_failed_statement(engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO counts VALUES (1, 1)"))
        assert conn.connection.driver_connection.holds_lock
        conn.rollback()
        assert not conn.connection.driver_connection.holds_lock
        with pytest.raises(DBAPIError):
            conn.execute(text("INSERT INTO no_such_table VALUES (1)"))
        conn.rollback()
        assert not conn.connection.driver_connection.holds_lock
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO counts VALUES (2, 2)"))
    with engine.connect() as conn:  # readers never take it, and the last writer gave it back
        assert conn.execute(text("SELECT count(*) FROM counts")).scalar() == 1
        assert not conn.connection.driver_connection.holds_lock


def test_a_writer_that_cannot_get_the_lock_in_time_is_told_the_database_is_locked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    engine = db.make_engine(f"sqlite:///{tmp_path / 'locked.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    with engine.connect() as holder, engine.connect() as waiter:
        holder.execute(text("INSERT INTO t VALUES (1)"))
        with pytest.raises(Exception, match="database is locked"):
            waiter.execute(text("INSERT INTO t VALUES (2)"))
        holder.commit()
        waiter.rollback()
        waiter.execute(text("INSERT INTO t VALUES (3)"))
        waiter.commit()
    engine.dispose()


def test_a_writing_transaction_holds_the_file_lock_other_processes_wait_on(engine, tmp_path: Path) -> None:
    """serve's workers share the database: a writer in one holds the flock beside it until its
    transaction ends, so a writer in another queues there instead of in SQLite's sleeping handler."""
    lock_file = tmp_path / "w.db.writer-lock"

    def free() -> bool:
        fd = os.open(lock_file, os.O_RDWR)  # another open file: flock conflicts as with another process
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    with engine.connect() as conn:
        conn.execute(text("INSERT INTO counts VALUES (1, 1)"))
        assert not free()
        conn.commit()
        assert free()


def _write_rows(url: str, writer: int, rows: int) -> None:
    engine = db.make_engine(url)
    for n in range(rows):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO counts VALUES (:w, :n)"), {"w": writer, "n": n})
    engine.dispose()


def test_writers_in_several_processes_all_commit(engine, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_write_rows, args=(url, writer, 100)) for writer in range(3)]
    for process in processes:
        process.start()
    _write_rows(url, 3, 100)
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0, 0, 0]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM counts")).scalar() == 400
