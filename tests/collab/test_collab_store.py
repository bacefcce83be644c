"""The update log and compaction, on SQLite and PostgreSQL."""

import threading

from pycrdt import Doc, Text

from collab.store import UpdateStore


def typed_updates(texts: list[str]) -> tuple[Doc, list[bytes]]:
    doc = Doc()
    text = doc.get("content", type=Text)
    updates: list[bytes] = []
    doc.observe(lambda event: updates.append(event.update))
    for piece in texts:
        text += piece
    return doc, updates


def rebuild(updates: list[bytes]) -> str:
    doc = Doc()
    text = doc.get("content", type=Text)
    for update in updates:
        doc.apply_update(update)
    return str(text)


def test_append_load_compact(store: UpdateStore, project_id: str) -> None:
    room = f"{project_id}/main.py"
    _, updates = typed_updates(["print(", "'héllo 😀'", ")\n"])
    store.append(room, updates[:2]).result()
    store.append(room, updates[2:]).result()
    assert rebuild(store.load(room)) == "print('héllo 😀')\n"
    assert store.log_length(room) == 3

    assert store.compact(room)
    assert store.log_length(room) == 0
    assert len(store.load(room)) == 1
    assert rebuild(store.load(room)) == "print('héllo 😀')\n"

    doc, more = typed_updates(["x"])
    store.append(room, more).result()
    assert store.compact(room)
    assert rebuild(store.load(room)).count("x") == 1


def test_rooms_are_separate(store: UpdateStore, project_id: str) -> None:
    _, a = typed_updates(["a"])
    _, b = typed_updates(["b"])
    store.append(f"{project_id}/a", a).result()
    store.append(f"{project_id}/b", b).result()
    assert rebuild(store.load(f"{project_id}/a")) == "a"
    store.delete(f"{project_id}/a")
    assert store.load(f"{project_id}/a") == []
    assert rebuild(store.load(f"{project_id}/b")) == "b"


def test_concurrent_appends_and_compactions_lose_nothing(store: UpdateStore, project_id: str) -> None:
    room = f"{project_id}/busy.txt"
    doc = Doc()
    text = doc.get("content", type=Text)
    updates: list[bytes] = []
    doc.observe(lambda event: updates.append(event.update))
    for i in range(200):
        text += f"<{i}>"
    errors: list[BaseException] = []

    def writer(chunk: list[bytes]) -> None:
        try:
            for update in chunk:
                store.append(room, [update]).result()
        except BaseException as exc:  # reported below
            errors.append(exc)

    def compactor() -> None:
        try:
            for _ in range(15):
                store.compact(room)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(updates[i::4],)) for i in range(4)]
    threads += [threading.Thread(target=compactor) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert rebuild(store.load(room)) == str(text)
    store.compact(room)
    assert rebuild(store.load(room)) == str(text)


def test_written_hashes(store: UpdateStore, project_id: str) -> None:
    room = f"{project_id}/f.txt"
    assert store.written_hashes(room) == set()
    store.mark_writing(room, "a" * 64).result()
    assert store.written_hashes(room) == {"a" * 64}
    store.mark_written(room, "a" * 64).result()
    store.mark_writing(room, "b" * 64).result()
    assert store.written_hashes(room) == {"a" * 64, "b" * 64}
    store.mark_written(room, "b" * 64).result()
    assert store.written_hashes(room) == {"b" * 64}


def test_many_rooms_writing_at_once_share_transactions(store: UpdateStore, project_id: str,
                                                       monkeypatch) -> None:
    """Writes from many threads go through one writer: all are stored, in fewer transactions."""
    rooms = [f"{project_id}/f{i}.py" for i in range(40)]
    updates = {room: typed_updates([f"{room} {n}\n" for n in range(10)])[1] for room in rooms}
    transactions = []
    begin = store.engine.begin

    def counted_begin():
        transactions.append(1)
        return begin()

    monkeypatch.setattr(store.engine, "begin", counted_begin)

    def type_into(room: str) -> None:
        for update in updates[room]:
            store.append(room, [update]).result()
        store.mark_written(room, "0" * 64).result()

    threads = [threading.Thread(target=type_into, args=(room,)) for room in rooms]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for room in rooms:
        assert rebuild(store.load(room)) == "".join(f"{room} {n}\n" for n in range(10))
        assert store.written_hashes(room) == {"0" * 64}
    assert len(transactions) < len(rooms) * 11


def test_a_failing_write_fails_alone(store: UpdateStore, project_id: str) -> None:
    good = f"{project_id}/good.py"
    _, updates = typed_updates(["fine\n"])
    errors = []

    def bad_write() -> None:
        try:
            store._write(lambda conn: conn.exec_driver_sql("INSERT INTO no_such_table VALUES (1)")).result()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=bad_write)] + [threading.Thread(target=lambda: store.append(good, updates).result())]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 1
    assert rebuild(store.load(good)) == "fine\n"
