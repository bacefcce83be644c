"""Rooms in one process, with pycrdt clients talking the wire protocol through in-memory sockets."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from collab_testkit import PyClient
from pycrdt import Doc, Text
from sqlalchemy.exc import OperationalError
from waiting import eventually

from collab import disk
from collab.disk import write_text_atomic
from collab.protocol import AwarenessEntry, Decoder, encode_awareness
from collab.room import RoomKey, sha256_text
from collab.rooms import RoomManager
from collab.store import UpdateStore


def state_vector(encoded: bytes) -> dict[int, int]:
    """Decode a Yjs state vector (client id -> clock); its byte order is not canonical."""
    decoder = Decoder(encoded)
    return {decoder.varuint(): decoder.varuint() for _ in range(decoder.varuint())}


@pytest.fixture
def file_path(project_root: Path, project_id: str) -> Path:
    path = project_root / project_id / "notes.md"
    path.write_text("hello 😀\n", encoding="utf-8")
    return path


async def joined(manager: RoomManager, key: RoomKey) -> PyClient:
    """alice, in the room once it has adopted the file as written."""
    return await joined_as(manager, key, "hello 😀\n")


@pytest.fixture
def key(project_id: str) -> RoomKey:
    return RoomKey(project_id, "notes.md")


@pytest.fixture
async def manager(store: UpdateStore, project_root: Path):
    rooms = RoomManager(store, lambda k: project_root / k.project_id / k.file_path, idle_unload_s=0.1)
    yield rooms
    await rooms.shutdown()


async def test_first_joiners_at_once_share_one_room_and_one_copy_of_the_file(
    manager: RoomManager, key: RoomKey, store: UpdateStore, file_path: Path
) -> None:
    rooms = await asyncio.gather(*(manager.acquire(key) for _ in range(20)))
    assert all(room is rooms[0] for room in rooms)
    assert str(rooms[0].text) == "hello 😀\n"
    for room in rooms:
        await manager.release(room)
    fresh = Doc()
    for update in store.load(key.name):
        fresh.apply_update(update)
    assert str(fresh.get("content", type=Text)) == "hello 😀\n"


async def test_edits_reach_others_and_disk_within_a_second(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    alice, bob = PyClient(manager, key, "alice"), PyClient(manager, key, "bob")
    await alice.start()
    await bob.start()
    await eventually(lambda: str(alice.text) == str(bob.text) == "hello 😀\n")
    alice.type(len("hello 😀".encode()), " wörld")
    await eventually(lambda: str(bob.text) == "hello 😀 wörld\n")
    edited = time.monotonic()
    await eventually(lambda: file_path.read_text(encoding="utf-8") == "hello 😀 wörld\n", timeout=1.0)
    assert time.monotonic() - edited < 1.0
    await alice.leave()
    await bob.leave()


async def test_viewer_updates_are_refused_but_presence_accepted(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    editor = PyClient(manager, key, "editor")
    viewer = PyClient(manager, key, "viewer", can_write=False)
    await editor.start()
    await viewer.start()
    await eventually(lambda: str(viewer.text) == "hello 😀\n")
    await eventually(lambda: len(editor.awareness) == 1 and "viewer" in next(iter(editor.awareness.values())))
    viewer.type(0, "HACK ")
    editor.type(0, "ok ")
    await eventually(lambda: str(viewer.text).startswith("HACK ok ") or str(viewer.text).startswith("ok HACK "))
    await asyncio.sleep(0.3)
    room = manager.rooms[key]
    assert str(room.text) == "ok hello 😀\n"
    assert str(editor.text) == "ok hello 😀\n"
    await eventually(lambda: file_path.read_text(encoding="utf-8") == "ok hello 😀\n")
    await editor.leave()
    await viewer.leave()


async def test_late_joiner_sees_presence_and_leaver_is_removed_at_once(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    alice, bob, carol = (PyClient(manager, key, name) for name in ("alice", "bob", "carol"))
    await alice.start()
    await bob.start()
    await eventually(lambda: bob.client_id in alice.awareness)
    await carol.start()
    await eventually(lambda: {alice.client_id, bob.client_id} <= set(carol.awareness))
    await bob.leave()
    await eventually(lambda: bob.client_id not in carol.awareness and bob.client_id not in alice.awareness, 0.5)
    await alice.leave()
    await carol.leave()


async def test_a_client_cannot_remove_someone_elses_presence(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    alice, mallory, carol = (PyClient(manager, key, name) for name in ("alice", "mallory", "carol"))
    for client in (alice, mallory, carol):
        await client.start()
    await eventually(lambda: alice.client_id in carol.awareness and mallory.client_id in carol.awareness)
    mallory._inbox.put_nowait(encode_awareness([AwarenessEntry(alice.client_id, 99, "null")]))
    mallory.set_presence({"user": {"name": "mallory"}, "cursor": 1}, clock=2)
    await eventually(lambda: "cursor" in carol.awareness[mallory.client_id])
    assert alice.client_id in carol.awareness
    for client in (alice, mallory, carol):
        await client.leave()


async def test_idle_room_unloads_and_reloads_exactly(
    manager: RoomManager, key: RoomKey, file_path: Path, store: UpdateStore
) -> None:
    alice = PyClient(manager, key, "alice")
    await alice.start()
    for i in range(30):
        alice.type(0, f"{i}é")
    await eventually(lambda: key in manager.rooms and str(manager.rooms[key].text) == str(alice.text))
    before_state = manager.rooms[key].doc.get_state()
    before_text = str(alice.text)
    await alice.leave()
    await eventually(lambda: key not in manager.rooms)
    assert file_path.read_text(encoding="utf-8") == before_text
    assert store.log_length(key.name) == 0  # compacted on unload
    async with manager.room(key) as room:
        assert str(room.text) == before_text
        assert state_vector(room.doc.get_state()) == state_vector(before_state)


async def test_outside_change_merges_with_unsaved_concurrent_typing(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    file_path.write_text("one\ntwo\nthree\n", encoding="utf-8")
    alice = PyClient(manager, key, "alice")
    await alice.start()
    await eventually(lambda: str(alice.text) == "one\ntwo\nthree\n")
    await eventually(lambda: manager.rooms[key].mirror.written_text == "one\ntwo\nthree\n")
    room = manager.rooms[key]
    # The program writes the file from what it read; meanwhile alice types at the end.
    room.mirror.debounce_s = room.mirror.max_delay_s = 5.0
    alice.type(len("one\ntwo\nthree\n"), "four 🦊\n")
    await eventually(lambda: "four" in str(room.text))
    file_path.write_text("one\nTWO (by a script)\nthree\n", encoding="utf-8")
    await eventually(lambda: "TWO" in str(alice.text), timeout=2.0)
    assert str(alice.text) == "one\nTWO (by a script)\nthree\nfour 🦊\n"
    await room.mirror.flush()
    assert file_path.read_text(encoding="utf-8") == "one\nTWO (by a script)\nthree\nfour 🦊\n"
    await alice.leave()


def write_like_the_files_api(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(text, encoding="utf-8")
    os.replace(scratch, path)


async def test_a_write_never_overwrites_a_change_on_disk_it_has_not_seen(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    alice = await joined(manager, key)
    room = manager.rooms[key]
    room.mirror.debounce_s = room.mirror.max_delay_s = 5.0
    alice.type(0, "typed ")
    await eventually(lambda: "typed" in str(room.text))
    # A run or the files API writes the file (atomically, as both do: a plain write_text could be polled
    # truncated, seen once in CI); a write (before a run, on unload) comes before the poll.
    write_like_the_files_api(file_path, "hello 😀\nfrom a program\n")
    await manager.flush_project(key.project_id)
    assert file_path.read_text(encoding="utf-8") == "typed hello 😀\nfrom a program\n"
    await eventually(lambda: str(alice.text) == "typed hello 😀\nfrom a program\n")
    # The files API says so at once: merged without waiting for the poll.
    room.mirror.poll_s = 60.0
    await asyncio.sleep(0.3)  # the mirror's loop is now waiting out the long poll
    write_like_the_files_api(file_path, "typed hello 😀\nfrom a program\nand the API\n")
    await manager.file_changed(key)
    assert str(room.text) == "typed hello 😀\nfrom a program\nand the API\n"
    await eventually(lambda: str(alice.text) == str(room.text))
    await alice.leave()


async def test_two_quick_outside_changes_apply_once_each(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    """Two saves through the files API (or a program writing twice) before any write of ours: the
    second is diffed against the first, not against the text we last wrote (issue 14, item 1)."""
    alice = await joined(manager, key)
    room = manager.rooms[key]
    room.mirror.poll_s = 60.0  # only the files API's notifications merge
    await asyncio.sleep(0.3)
    file_path.write_text("base\nline1\n", encoding="utf-8")
    await manager.file_changed(key)
    file_path.write_text("base\nline1\nline2\n", encoding="utf-8")
    await manager.file_changed(key)
    assert str(room.text) == "base\nline1\nline2\n"
    await room.mirror.flush()
    assert file_path.read_text(encoding="utf-8") == "base\nline1\nline2\n"
    # Two whole-file saves of different texts: the later one wins, nothing blends.
    for text in ("print(1)\n# first-AAAA\n", "print(1)\n# second-BBBB\n"):
        file_path.write_text(text, encoding="utf-8")
        await manager.file_changed(key)
    assert str(room.text) == "print(1)\n# second-BBBB\n"
    await eventually(lambda: str(alice.text) == "print(1)\n# second-BBBB\n")
    await room.mirror.flush()
    assert file_path.read_text(encoding="utf-8") == "print(1)\n# second-BBBB\n"
    await alice.leave()


async def test_an_outside_write_landing_during_our_write_is_merged_not_overwritten(
    manager: RoomManager, key: RoomKey, file_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = await joined(manager, key)
    room = manager.rooms[key]
    room.mirror.debounce_s = room.mirror.max_delay_s = room.mirror.poll_s = 60.0
    await asyncio.sleep(0.3)
    alice.type(0, "typed ")
    await eventually(lambda: "typed" in str(room.text))
    mark_writing = room.mark_writing

    def save_lands_meanwhile(text: str) -> Future[None]:
        monkeypatch.setattr(room, "mark_writing", mark_writing)
        file_path.write_text("hello 😀\nsaved meanwhile\n", encoding="utf-8")
        return mark_writing(text)

    monkeypatch.setattr(room, "mark_writing", save_lands_meanwhile)
    await room.mirror.flush()
    assert file_path.read_text(encoding="utf-8") == "typed hello 😀\nsaved meanwhile\n"
    await eventually(lambda: str(alice.text) == "typed hello 😀\nsaved meanwhile\n")
    await alice.leave()


async def test_a_write_cut_off_by_closing_the_room_is_not_merged_back_as_an_outside_edit(
    manager: RoomManager, key: RoomKey, file_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops while the mirror writes: the rename still happens in its thread, and the
    write must still be recorded, or the closing flush merges our own text again (a line twice)."""
    alice = await joined(manager, key)
    room = manager.rooms[key]
    room.mirror.debounce_s = room.mirror.max_delay_s = room.mirror.poll_s = 60.0
    await asyncio.sleep(0.3)
    alice.type(len("hello 😀\n".encode()), "- two\n")
    await eventually(lambda: "two" in str(room.text))
    renaming = threading.Event()

    def slow_write(path: Path, text: str, expected: disk.FileStamp | None) -> None:
        renaming.set()
        time.sleep(0.5)
        write_text_atomic(path, text, expected)

    monkeypatch.setattr(disk, "write_text_atomic", slow_write)
    writing = asyncio.create_task(room.mirror.flush())
    await eventually(renaming.is_set)
    writing.cancel()
    await asyncio.gather(writing, return_exceptions=True)
    await manager.shutdown()  # unloads: stops the mirror and flushes
    assert file_path.read_text(encoding="utf-8") == "hello 😀\n- two\n"
    assert str(room.text) == "hello 😀\n- two\n"
    await alice.leave()


async def test_a_busy_database_delays_storing_but_keeps_the_room_open(
    manager: RoomManager, key: RoomKey, file_path: Path, store: UpdateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the pool or SQLite's write lock can be busy for a moment: that used to close the
    room and drop every editor of the file (issue 25)."""
    alice, bob = PyClient(manager, key, "alice"), PyClient(manager, key, "bob")
    await alice.start()
    await bob.start()
    await eventually(lambda: str(alice.text) == str(bob.text) == "hello 😀\n")
    append, failures = store.append, []

    def busy_twice(room: str, updates: list[bytes]) -> Future[None]:
        if len(failures) < 2:
            failures.append(room)
            raise OperationalError("INSERT ...", {}, Exception("database is locked"))
        return append(room, updates)

    monkeypatch.setattr(store, "append", busy_twice)
    alice.type(0, "still here ")
    await eventually(lambda: str(bob.text) == "still here hello 😀\n", timeout=3.0)
    await asyncio.wait_for(manager.rooms[key].wait_stored(), 3.0)
    assert len(failures) == 2 and not manager.rooms[key].closed
    await alice.leave()
    await bob.leave()


async def test_keystrokes_reach_other_editors_without_waiting_for_the_commit(
    manager: RoomManager, key: RoomKey, file_path: Path, store: UpdateStore
) -> None:
    """Fan-out waited for the writer's commit, whose tail under a class's load (60-330 ms) became
    every keystroke's (issue 25). The file on disk still follows only stored edits."""
    alice = await joined(manager, key)
    bob = PyClient(manager, key, "bob")
    await bob.start()
    await eventually(lambda: str(bob.text) == "hello 😀\n")
    release = threading.Event()
    busy = store._write(lambda conn: None if release.wait(10) else None)  # the writer is busy until released
    try:
        alice.type(0, "typed ")
        await eventually(lambda: str(bob.text) == "typed hello 😀\n", timeout=2.0)
        assert len(store.load(key.name)) == 1  # the file's first text only: the edit is not stored yet
        await asyncio.sleep(1.2)  # longer than the disk mirror's debounce
        assert file_path.read_text(encoding="utf-8") == "hello 😀\n"
    finally:
        release.set()
    busy.result()
    await eventually(lambda: file_path.read_text(encoding="utf-8") == "typed hello 😀\n", timeout=5.0)
    await alice.leave()
    await bob.leave()


async def test_an_edit_whose_store_failed_comes_back_with_its_editors(
    manager: RoomManager, key: RoomKey, file_path: Path, store: UpdateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editors see an edit before it is stored; if storing it fails the room closes them, and the
    edit returns when they reconnect (Yjs clients hand back what the server lacks)."""
    alice = await joined(manager, key)
    bob = PyClient(manager, key, "bob")
    await bob.start()
    await eventually(lambda: str(bob.text) == "hello 😀\n")
    append, broken = store.append, [True]

    def append_unless_broken(room: str, updates: list[bytes]) -> Future[None]:
        if broken[0]:
            raise RuntimeError("the disk is full")
        return append(room, updates)

    monkeypatch.setattr(store, "append", append_unless_broken)
    alice.type(0, "kept ")
    await eventually(lambda: alice.closed_with == bob.closed_with == 1011, timeout=3.0)
    assert str(bob.text) == "kept hello 😀\n"
    broken[0] = False
    bob = await bob.reconnect()
    await eventually(lambda: key in manager.rooms and str(manager.rooms[key].text) == "kept hello 😀\n", timeout=3.0)
    await eventually(lambda: file_path.read_text(encoding="utf-8") == "kept hello 😀\n", timeout=5.0)
    stored = Doc()
    for update in store.load(key.name):
        stored.apply_update(update)
    assert str(stored.get("content", type=Text)) == "kept hello 😀\n"
    await bob.leave()


async def test_an_outside_change_is_diffed_off_the_event_loop(
    manager: RoomManager, key: RoomKey, file_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Diffing a large file takes long: on the event loop it stalled every room and request."""
    import collab.room

    alice = await joined(manager, key)
    threads, rebase = [], collab.room._rebase

    def recorded(*args):
        threads.append(threading.current_thread())
        return rebase(*args)

    monkeypatch.setattr(collab.room, "_rebase", recorded)
    file_path.write_text("hello 😀\n" + "line\n" * 5000, encoding="utf-8")
    await manager.file_changed(key)
    assert str(manager.rooms[key].text).count("line\n") == 5000
    assert threads and threading.main_thread() not in threads
    await alice.leave()


async def test_set_text_reaches_clients_as_an_edit(manager: RoomManager, key: RoomKey, file_path: Path) -> None:
    alice = PyClient(manager, key, "alice")
    await alice.start()
    await eventually(lambda: str(alice.text) == "hello 😀\n")
    await manager.set_text(key, "hello 😀 restored\n")
    await eventually(lambda: str(alice.text) == "hello 😀 restored\n")
    assert file_path.read_text(encoding="utf-8") == "hello 😀 restored\n"
    await alice.leave()


async def test_reload_after_crash_keeps_document_over_stale_file(
    store: UpdateStore, project_root: Path, key: RoomKey, file_path: Path
) -> None:
    """A crash before the disk write leaves the file behind the stored document: no revert."""
    first = RoomManager(store, lambda k: project_root / k.project_id / k.file_path, idle_unload_s=60)
    room = await first.acquire(key)
    await room.set_text("hello 😀\nnew line\n")
    # Simulate the crash: the file still has the old text the server last wrote.
    file_path.write_text("hello 😀\n", encoding="utf-8")
    store.mark_written(key.name, sha256_text("hello 😀\n")).result()
    for task in (room._flusher, room.mirror._task):
        task.cancel()
    second = RoomManager(store, lambda k: project_root / k.project_id / k.file_path, idle_unload_s=60)
    async with second.room(key) as reloaded:
        assert str(reloaded.text) == "hello 😀\nnew line\n"
        await reloaded.mirror.flush()
    assert file_path.read_text(encoding="utf-8") == "hello 😀\nnew line\n"
    await second.shutdown()


async def test_file_edited_while_room_closed_enters_as_an_edit(
    manager: RoomManager, key: RoomKey, file_path: Path
) -> None:
    async with manager.room(key) as room:
        assert str(room.text) == "hello 😀\n"
    await eventually(lambda: key not in manager.rooms)
    file_path.write_text("hello 😀\nfrom git\n", encoding="utf-8")
    async with manager.room(key) as room:
        assert str(room.text) == "hello 😀\nfrom git\n"


async def test_rooms_waiting_for_the_store_hold_no_worker_thread(
    manager: RoomManager, store: UpdateStore, project_root: Path, project_id: str
) -> None:
    """Each room used to wait for the store's writer inside a worker thread: a class's rooms parked
    every thread, and the loop's file reads, writes and git work queued behind them (issue 25)."""
    clients = []
    for i in range(12):  # twice the event loop's default thread pool on this machine
        (project_root / project_id / f"f{i}.md").write_text("x\n", encoding="utf-8")
        key = RoomKey(project_id, f"f{i}.md")
        clients.append(await joined_as(manager, key, "x\n"))
    release = threading.Event()
    busy = store._write(lambda conn: None if release.wait(10) else None)  # the writer is busy until released
    for client in clients:
        client.type(0, "typed ")
    await asyncio.sleep(0.3)  # every room's flush is now waiting for the writer
    try:
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 2.0)
    finally:
        release.set()
    busy.result()
    for i in range(12):
        await eventually(lambda i=i: store.load(RoomKey(project_id, f"f{i}.md").name) != [])
    for client in clients:
        await client.leave()


async def joined_as(manager: RoomManager, key: RoomKey, text: str) -> PyClient:
    """alice, in the room once it has adopted the file as written and she has its text.

    Typing before her copy holds the file's text makes her insert concurrent with the file's own
    (CI once saw "typed " land after the file's text), which is not what these tests are about.
    """
    client = PyClient(manager, key, "alice")
    await client.start()
    await eventually(lambda: key in manager.rooms and manager.rooms[key].mirror.written_text == text)
    await eventually(lambda: str(client.text) == text)
    return client


async def test_an_update_arriving_while_the_owner_reads_the_file_is_kept(
    store: UpdateStore, key: RoomKey, file_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica's edit can land while a room being opened reads its file: the file's text
    is merged with it. Replacing the document's text with the file's erased that edit."""
    import collab.room

    reading, go_on, calls = threading.Event(), threading.Event(), []

    def slow_read(path: Path) -> str:
        calls.append(path)
        if len(calls) == 2:  # the disk owner's reconcile, after load's binary-file check
            reading.set()
            go_on.wait(5)
        return disk.read_text(path)

    monkeypatch.setattr(collab.room, "read_text", slow_read)
    room = collab.room.Room(key, file_path, store, None)
    loading = asyncio.create_task(room.load())
    assert await asyncio.to_thread(reading.wait, 5)
    remote = Doc()
    remote.get("content", type=Text).insert(0, "from the other replica\n")
    room.receive_remote_update(remote.get_update())
    go_on.set()
    await loading
    assert sorted(str(room.text).splitlines()) == ["from the other replica", "hello 😀"]
    await room.unload(keep=True)
