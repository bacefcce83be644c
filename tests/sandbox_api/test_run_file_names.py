"""File names the API cannot carry (not UTF-8, control characters) and limits that are not finite
numbers: a run that makes such a name, a project that already holds one, an old run record that
stores one, and NaN/infinite limits from the API or codeyard.toml all end in a clear answer, never
a 500 (issue 14, defects 2 and 3)."""

from __future__ import annotations

import io
import json
import os
import secrets
import zipfile
from datetime import UTC, datetime

import pytest
from conftest import new_project, wait_finished
from file_names import FILE_NAMES
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Text
from test_run_sockets import frames_until_exit

from collab.protocol import SyncStep2, decode_message, encode_sync_step1, encode_sync_update
from sandbox.models import RunRow

BAD_NAME_PROGRAM = ('import os\nopen(os.fsdecode(b"bad\\xffname.txt"), "w").write("x")\n'
                    'open("new\\nline.txt", "w").write("y")\nopen("fine.txt", "w").write("z")\n')


def test_a_run_that_writes_a_name_that_is_not_utf8_leaves_the_project_working(owner):
    pid = new_project(owner, {"main.py": BAD_NAME_PROGRAM})
    run_id = owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"]
    with owner.websocket_connect(f"/ws/runs/{run_id}") as ws:
        exit_frame = frames_until_exit(ws)[-1]
    assert exit_frame["verdict"] == "ok"

    run = owner.get(f"/api/runs/{run_id}")
    assert run.status_code == 200, run.text
    assert run.json()["files_written"] == ["fine.txt"]
    message = run.json()["message"]
    assert "name the IDE cannot show" in message and exit_frame["message"] == message
    assert "'bad\\xffname.txt' (path must be valid UTF-8)" in message
    assert "'new\\x0aline.txt' (path must not contain control characters)" in message
    assert owner.get(f"/api/projects/{pid}/runs").status_code == 200
    tree = owner.get(f"/api/projects/{pid}/files")
    assert tree.status_code == 200 and [e["path"] for e in tree.json()] == ["README.md", "fine.txt", "main.py"]
    download = owner.get(f"/api/projects/{pid}/files/zip")
    assert download.status_code == 200
    assert sorted(zipfile.ZipFile(io.BytesIO(download.content)).namelist()) == ["README.md", "fine.txt", "main.py"]


def test_a_project_holding_such_names_lists_them_escaped_and_can_be_repaired(owner, app):
    """Put there by hand, by the shell of an older server, or an older copy-out: the tree shows them
    escaped, and read, rename and delete take that escaped path."""
    pid = new_project(owner, {"keep.txt": "kept"})
    root = os.fsencode(app.state.settings.projects_dir / pid)
    for raw, data in ((b"bad\xffname.txt", b"rescue me"), (b"new\nline.txt", b"y"), (b"dir\x1b/inner.txt", b"z")):
        os.makedirs(os.path.dirname(os.path.join(root, raw)), exist_ok=True)
        with open(os.path.join(root, raw), "wb") as f:
            f.write(data)
    files = f"/api/projects/{pid}/files"

    tree = owner.get(files)
    assert tree.status_code == 200, tree.text
    assert [e["path"] for e in tree.json()] == [
        "README.md", "bad\\xffname.txt", "dir\\x1b", "dir\\x1b/inner.txt", "keep.txt", "main.py", "new\\x0aline.txt"]
    download = owner.get(f"{files}/zip")
    assert download.status_code == 200
    assert sorted(zipfile.ZipFile(io.BytesIO(download.content)).namelist()) == ["README.md", "keep.txt", "main.py"]

    assert owner.get(f"{files}/content/bad%5Cxffname.txt").content == b"rescue me"
    moved = owner.post(f"{files}/move", json={"src": "bad\\xffname.txt", "dst": "rescued.txt"})
    assert moved.status_code == 200 and moved.json()["path"] == "rescued.txt", moved.text
    assert owner.get(f"{files}/content/rescued.txt").content == b"rescue me"
    assert owner.delete(f"{files}/content/new%5Cx0aline.txt").status_code == 204
    assert owner.delete(f"{files}/content/dir%5Cx1b").status_code == 204
    assert [e["path"] for e in owner.get(files).json()] == ["README.md", "keep.txt", "main.py", "rescued.txt"]

    # Escaped paths only ever name what exists: nothing new is made under them, and a bad escape is a 400.
    assert owner.post(files, json={"path": "bad\\xffname.txt"}).status_code == 400
    assert owner.put(f"{files}/content/bad%5Cxffname.txt", content=b"x").status_code == 400
    assert owner.post(f"{files}/move", json={"src": "keep.txt", "dst": "bad\\xff.txt"}).status_code == 400
    for path in ("a%5Cx2e%5Cx2e", "bad%5Cxzz", "%5Cx2fetc%5Cx2fpasswd"):
        answer = owner.delete(f"{files}/content/{path}")
        assert answer.status_code == 400 and answer.json()["detail"], path
    assert owner.get(f"{files}/content/bad%5Cxffname.txt").status_code == 404


def test_old_run_records_with_raw_names_stay_readable(owner, app):
    """A record stored before copy-out refused such names keeps the run and the run list readable."""
    pid = new_project(owner, {"main.py": ""})
    run_id = secrets.token_hex(8)
    with app.state.sessionmaker() as db, db.begin():
        db.add(RunRow(id=run_id, project_id=pid, user_id=None, argv=["python3", "./bad\udcff.py"], status="finished",
                      verdict="ok", files_written=["bad\udcffname.txt", "out/ok.txt"], message="",
                      created_at=datetime.now(UTC), finished_at=datetime.now(UTC)))
    run = owner.get(f"/api/runs/{run_id}")
    assert run.status_code == 200, run.text
    assert run.json()["files_written"] == ["bad\\xffname.txt", "out/ok.txt"]
    assert run.json()["argv"] == ["python3", "./bad\\udcff.py"]
    listed = owner.get(f"/api/projects/{pid}/runs")
    assert listed.status_code == 200 and [r["id"] for r in listed.json()] == [run_id]


@pytest.mark.parametrize(("limits", "field", "why"), [
    ('{"memory_bytes": 1e400}', "memory_bytes", "must be a finite number"),
    ('{"pids": -Infinity}', "pids", "must be a finite number"),
    ('{"wall_seconds": NaN}', "wall_seconds", "must be a finite number"),
    ('{"cpu_seconds": 0}', "cpu_seconds", "must be a positive number"),
    ('{"pids": 0.5}', "pids", "must be a positive number (at least 1)"),
    ('{"memory_bytes": -1}', "memory_bytes", "must be a positive number"),
    ('{"output_bytes": 1e300}', "output_bytes", "must be at most 9007199254740992"),
])
def test_limits_that_are_not_finite_positive_numbers_are_a_422_naming_the_field(owner, limits, field, why):
    pid = new_project(owner, {"main.py": "print(1)\n"})
    answer = owner.post(f"/api/projects/{pid}/runs", content=f'{{"limits": {limits}}}',
                        headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert f"limits.{field} {why}" in answer.json()["detail"]


@pytest.mark.parametrize(("toml", "message"), [
    ("memory_bytes = inf", "codeyard.toml: run.limits.memory_bytes must be a finite number, got inf"),
    ("pids = -inf", "codeyard.toml: run.limits.pids must be a finite number, got -inf"),
    ("wall_seconds = nan", "codeyard.toml: run.limits.wall_seconds must be a finite number, got nan"),
    ("memory_bytes = 9223372036854775807", "codeyard.toml: run.limits.memory_bytes must be at most"),
])
def test_codeyard_toml_limits_that_are_not_finite_are_a_400_naming_the_field(owner, toml, message):
    pid = new_project(owner, {"main.py": "print(1)\n", "codeyard.toml": f"[run.limits]\n{toml}\n"})
    answer = owner.post(f"/api/projects/{pid}/runs", json={})
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["detail"]


def test_huge_limits_below_the_ceiling_are_lowered_to_the_server_maximum(owner, app):
    pid = new_project(owner, {"main.py": "print('ran')\n"})
    run = owner.post(f"/api/projects/{pid}/runs", json={"limits": {"memory_bytes": 1e15, "wall_seconds": 1e9}})
    assert run.status_code == 202, run.text
    assert wait_finished(owner, run.json()["id"])["stdout"] == "ran\n"


def test_lone_surrogates_in_json_bodies_are_refused(owner):
    """JSON may spell "\\udcff", which no file name, file or program input can hold (pydantic refuses it)."""
    pid = new_project(owner, {"main.py": "print(input())\n"})
    for url, body in ((f"/api/projects/{pid}/files", {"path": "bad\udcff.txt"}),
                      (f"/api/projects/{pid}/files", {"path": "ok.txt", "content": "bad\udcff"}),
                      (f"/api/projects/{pid}/runs", {"stdin": "bad\udcff"}),
                      (f"/api/projects/{pid}/runs", {"entry": "bad\udcff.py"})):
        answer = owner.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert answer.status_code in (400, 422), (body, answer.status_code, answer.text)
        assert "unicode" in answer.json()["detail"], answer.text


WRITE_NAMES_PROGRAM = """import os, sys
for name in sys.stdin.read().split():
    try:
        open(os.fsdecode(bytes.fromhex(name)), "wb").write(b"from the run")
    except OSError:  # a name past 255 bytes
        pass
"""
RUN_NAMES = st.lists(FILE_NAMES.filter(lambda raw: raw not in (b"main.py", b"notes.md")), max_size=5, unique=True)


def edit_through_collab(person, project_id: str, path: str, piece: str) -> str:
    """Type `piece` at the start of the file as an editor tab would; returns the text a second tab then sees."""
    def synced(ws) -> tuple[Doc, Text]:
        doc = Doc()
        text = doc.get("content", type=Text)
        ws.send_bytes(encode_sync_step1(doc.get_state()))
        while not isinstance(message := decode_message(ws.receive_bytes()), SyncStep2):
            pass
        doc.apply_update(message.update)
        return doc, text

    url = f"/ws/collab/{project_id}/{path}"
    with person.websocket_connect(url) as ws:
        doc, text = synced(ws)
        before = doc.get_state()
        text.insert(0, piece)
        ws.send_bytes(encode_sync_update(doc.get_update(before)))
        with person.websocket_connect(url) as other:
            return str(synced(other)[1])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planted=RUN_NAMES, written=RUN_NAMES)
@example(planted=[b"%01", b"%ok"], written=[b"%41"])  # '%' then hex digits: once lost in the test's own URL
def test_any_file_names_leave_runs_tree_zip_and_editing_working(owner, app, planted, written):
    """Names planted in the project by hand (an older server, the shell) and names a run writes: the run,
    the run list, the tree, the zip, each listed file and editing a normal file all keep answering."""
    pid = new_project(owner, {"main.py": WRITE_NAMES_PROGRAM, "notes.md": "notes\n"})
    root = os.fsencode(app.state.settings.projects_dir / pid)
    for raw in planted:
        try:
            with open(os.path.join(root, raw), "wb") as f:
                f.write(b"by hand")
        except OSError:
            pass
    stdin = " ".join(raw.hex() for raw in written)
    run_id = owner.post(f"/api/projects/{pid}/runs", json={"stdin": stdin}).json()["id"]

    run = wait_finished(owner, run_id)
    assert run["verdict"] == "ok", run
    assert owner.get(f"/api/projects/{pid}/runs").status_code == 200
    tree = owner.get(f"/api/projects/{pid}/files")
    assert tree.status_code == 200, tree.text
    for entry in tree.json():
        if entry["kind"] == "file":
            # '%' twice: Starlette's TestClient unquotes the path httpx already decoded (a name '%01' reached
            # the app as a control character); a real server decodes once.
            path = "/".join(part.replace("%", "%2525").replace("?", "%3F").replace("#", "%23") for part in entry["path"].split("/"))
            assert owner.get(f"/api/projects/{pid}/files/content/{path}").status_code == 200, entry
    assert set(run["files_written"]) <= {entry["path"] for entry in tree.json()}
    assert owner.get(f"/api/projects/{pid}/files/zip").status_code == 200
    assert edit_through_collab(owner, pid, "notes.md", "typed ") == "typed notes\n"


def test_history_checkpoints_and_restores_a_project_holding_such_names(owner, app):
    """GitPython's index reader fails on a name that is not UTF-8: checkpoints (and so every run, which
    checkpoints first) must still work, and a restore brings such a file back without a room."""
    pid = new_project(owner, {"notes.md": "v1\n"})
    root = app.state.settings.projects_dir / pid
    with open(os.path.join(os.fsencode(root), b"bad\xffname.txt"), "wb") as f:
        f.write(b"kept in history \xff")
    history = f"/api/projects/{pid}/history"
    first = owner.post(history, json={"message": "with a bad name"})
    assert first.status_code == 201, first.text
    os.unlink(os.path.join(os.fsencode(root), b"bad\xffname.txt"))
    assert owner.put(f"/api/projects/{pid}/files/content/notes.md", content=b"v2\n").status_code == 200
    second = owner.post(history, json={"message": "without it"})
    assert second.status_code == 201
    diff = owner.get(f"{history}/diff", params={"old": first.json()["version"], "new": second.json()["version"]})
    assert diff.status_code == 200, diff.text  # git quotes the name; bytes of the text that are not UTF-8 show as U+FFFD
    assert '"a/bad\\377name.txt"' in diff.json()["diff"] and "-kept in history \ufffd" in diff.json()["diff"]
    restored = owner.post(f"{history}/restore", json={"version": first.json()["version"]})
    assert restored.status_code in (200, 204), restored.text
    assert owner.get(f"/api/projects/{pid}/files/content/bad%5Cxffname.txt").content == b"kept in history \xff"
    run = owner.post(f"/api/projects/{pid}/runs", json={})  # checkpoints first
    assert run.status_code == 202, run.text
    assert wait_finished(owner, run.json()["id"])["verdict"] == "ok"
