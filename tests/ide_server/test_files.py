"""Files API: tree, read/write (binary-exact), create, move, delete, zip download and upload."""

import asyncio
import io
import os
import zipfile

import pytest
from starlette.requests import Request

from ide_server.api.files import _body_to_file
from ide_server.errors import InvalidInput


@pytest.fixture
def owner_and_project(new_user):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "files", "template": "python"}).json()["id"]
    return alice, f"/api/projects/{pid}/files"


def test_binary_files_round_trip_byte_for_byte(owner_and_project):
    alice, files = owner_and_project
    payloads = {
        "all-bytes.bin": bytes(range(256)) * 4,
        "random.bin": os.urandom(300_000),
        "empty.bin": b"",
        "latin1.txt": "café".encode("latin-1"),
        "image.png": b"\x89PNG\r\n\x1a\n" + os.urandom(1000),
    }
    for name, data in payloads.items():
        response = alice.put(f"{files}/content/bin/{name}", content=data)
        assert response.status_code == 200, response.text
        assert response.json() == {"path": f"bin/{name}", "kind": "file", "size": len(data)}
    for name, data in payloads.items():
        response = alice.get(f"{files}/content/bin/{name}")
        assert response.content == data
        assert response.headers["x-content-type-options"] == "nosniff"
    assert alice.get(f"{files}/content/bin/image.png").headers["content-type"] == "image/png"


def test_tree_create_move_delete(owner_and_project):
    alice, files = owner_and_project
    assert alice.post(files, json={"path": "src/app/util.py", "content": "X = 1\n"}).status_code == 201
    assert alice.post(files, json={"path": "docs", "kind": "directory"}).status_code == 201
    response = alice.post(files, json={"path": "src/app/util.py", "content": "again"})
    assert response.status_code == 409 and "already exists" in response.json()["detail"]
    assert alice.post(files, json={"path": "docs", "kind": "directory"}).status_code == 409

    tree = alice.get(files).json()
    assert [(e["path"], e["kind"]) for e in tree] == [
        ("README.md", "file"),
        ("docs", "directory"),
        ("main.py", "file"),
        ("src", "directory"),
        ("src/app", "directory"),
        ("src/app/util.py", "file"),
    ]

    moved = alice.post(f"{files}/move", json={"src": "src/app", "dst": "lib/app"})
    assert moved.json() == {"path": "lib/app", "kind": "directory", "size": 0}
    assert alice.get(f"{files}/content/lib/app/util.py").text == "X = 1\n"
    assert alice.get(f"{files}/content/src/app/util.py").status_code == 404
    assert alice.post(f"{files}/move", json={"src": "main.py", "dst": "README.md"}).status_code == 409
    assert alice.post(f"{files}/move", json={"src": "nope.py", "dst": "x.py"}).status_code == 404
    assert alice.post(f"{files}/move", json={"src": "lib", "dst": "lib/inner"}).status_code == 400

    assert alice.delete(f"{files}/content/lib").status_code == 204
    assert alice.delete(f"{files}/content/main.py").status_code == 204
    assert alice.delete(f"{files}/content/main.py").status_code == 404
    assert [e["path"] for e in alice.get(files).json()] == ["README.md", "docs", "src"]


def test_reading_and_writing_errors_are_4xx_with_a_message(owner_and_project, settings):
    alice, files = owner_and_project
    response = alice.get(f"{files}/content/missing.txt")
    assert response.status_code == 404 and response.json()["detail"] == "'missing.txt' does not exist"
    alice.post(files, json={"path": "folder", "kind": "directory"})
    response = alice.get(f"{files}/content/folder")
    assert response.status_code == 400 and "is a folder" in response.json()["detail"]
    assert alice.put(f"{files}/content/folder", content=b"x").status_code == 400
    assert alice.get(f"{files}/content/main.py/child").status_code == 404

    too_big = b"x" * (settings.max_file_bytes + 1)
    response = alice.put(f"{files}/content/big.bin", content=too_big)
    assert response.status_code == 413 and "larger than" in response.json()["detail"]
    assert alice.get(f"{files}/content/big.bin").status_code == 404


def test_zip_download_and_upload(owner_and_project):
    alice, files = owner_and_project
    alice.put(f"{files}/content/data/blob.bin", content=bytes(range(256)))
    archive = zipfile.ZipFile(io.BytesIO(alice.get(f"{files}/zip").content))
    assert set(archive.namelist()) == {"README.md", "main.py", "data/", "data/blob.bin"}
    assert archive.read("data/blob.bin") == bytes(range(256))

    upload = io.BytesIO()
    with zipfile.ZipFile(upload, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/mod.py", "VALUE = 42\n")
        zf.writestr("assets/", "")
        zf.writestr("main.py", "print('replaced')\n")
        zf.writestr("raw.bin", bytes(range(256)))
    response = alice.post(f"{files}/zip", content=upload.getvalue(), headers={"content-type": "application/zip"})
    assert response.status_code == 200, response.text
    assert response.json() == {"files_written": 4}
    assert alice.get(f"{files}/content/pkg/mod.py").text == "VALUE = 42\n"
    assert alice.get(f"{files}/content/main.py").text == "print('replaced')\n"
    assert alice.get(f"{files}/content/raw.bin").content == bytes(range(256))
    assert any(e["path"] == "assets" and e["kind"] == "directory" for e in alice.get(files).json())


def test_bad_and_oversized_zips_are_refused(owner_and_project, settings):
    alice, files = owner_and_project
    response = alice.post(f"{files}/zip", content=b"this is not a zip")
    assert response.status_code == 400 and "not a valid zip" in response.json()["detail"]

    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            zf.writestr(f"zeros{i}.bin", b"\0" * settings.max_file_bytes)
    assert len(bomb.getvalue()) < 100_000  # small upload, big expansion
    response = alice.post(f"{files}/zip", content=bomb.getvalue())
    assert response.status_code == 413 and "expands to more than" in response.json()["detail"]
    assert not any(e["path"].startswith("zeros") for e in alice.get(files).json())

    huge = b"x" * (settings.max_upload_bytes + 1)
    assert alice.post(f"{files}/zip", content=huge).status_code == 413


def test_an_upload_cut_off_midway_is_a_clear_400_not_a_server_error():
    """A client that gives up mid-upload (its timeout) used to be logged as an exception in the
    ASGI application; it is an InvalidInput (400) now, and nothing is kept of the part sent."""
    messages = iter([{"type": "http.request", "body": b"print(", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    request = Request({"type": "http", "method": "PUT", "headers": [(b"content-length", b"100")]}, receive)
    with pytest.raises(InvalidInput, match="cut off"):
        asyncio.run(_body_to_file(request, limit=1000))
