"""Property: whatever names a program gives its files (any bytes, control characters, long names,
NFC and NFD spellings), copy_out brings back exactly those the files API can carry, reports the
others in JSON-safe form, and a project holding any of them (put there by hand) still lists,
zips, reads and deletes (issue 14, defect 2). copy_out directly, so hundreds of cases stay fast;
tests/sandbox_api/test_run_file_names.py runs the same names through real runs and the API."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

from file_names import FILE_NAMES
from hypothesis import given, settings
from hypothesis import strategies as st

from ide_server import paths
from ide_server.errors import NotFound
from ide_server.services import files
from sandbox.files import copy_in, copy_out

NAME_LISTS = st.lists(FILE_NAMES, min_size=1, max_size=6, unique=True)


def plant(folder: bytes, names: list[bytes]) -> list[bytes]:
    """Write each name that the file system takes (a name past 255 bytes it does not); returns those."""
    made = []
    for raw in names:
        try:
            with open(os.path.join(folder, raw), "wb") as f:
                f.write(b"data of " + raw)
        except OSError:
            continue
        made.append(raw)
    return made


def json_safe(value: object) -> str:
    """As the app answers: JSON with ensure_ascii=False, encoded as UTF-8 (lone surrogates fail here)."""
    text = json.dumps(value, ensure_ascii=False)
    text.encode()
    return text


@settings(max_examples=150, deadline=None)
@given(names=NAME_LISTS)
def test_copy_out_brings_back_exactly_the_names_the_api_can_carry(tmp_path_factory, names):
    project, workspace = tmp_path_factory.mktemp("project"), tmp_path_factory.mktemp("workspace")
    snapshot = copy_in(project, workspace, max_bytes=1 << 20, max_files=100, owner=None)
    written = plant(os.fsencode(workspace), names)

    report = copy_out(workspace, project, snapshot, max_bytes=1 << 20, max_files=100)

    carried = {raw for raw in written if paths.problem(os.fsdecode(raw)) is None}
    assert set(os.listdir(os.fsencode(project))) == carried
    for raw in carried:
        assert (project / os.fsdecode(raw)).read_bytes() == b"data of " + raw
    refused = {paths.escape(os.fsdecode(raw)): raw for raw in written if raw not in carried}
    assert set(report.bad_names) == set(refused)
    for shown, raw in refused.items():
        assert os.fsencode(paths.existing(shown)) == raw  # the shown name leads back to the file
    json_safe(dataclasses.asdict(report))
    notice = json_safe(report.notice())
    assert all(shown in json.loads(notice) for shown in list(refused)[:5])
    assert bool(report.notice()) == bool(refused)


@settings(max_examples=150, deadline=None)
@given(names=NAME_LISTS)
def test_a_project_holding_any_names_still_lists_zips_reads_and_deletes(tmp_path_factory, names):
    root = tmp_path_factory.mktemp("project")
    (root / "ok").mkdir()
    planted = plant(os.fsencode(root), names) + [b"ok/" + raw for raw in plant(os.fsencode(root / "ok"), names)]

    tree = files.tree(root)
    json_safe([dataclasses.asdict(entry) for entry in tree])
    shown = {entry.path for entry in tree if entry.kind == "file"}
    assert shown == {paths.escape(os.fsdecode(raw)) for raw in planted}
    with zipfile.ZipFile(files.zip_project(root)) as archive:
        assert set(archive.namelist()) == {"ok/"} | {name for name in shown if "\\" not in name}
    for path in shown:
        raw = os.fsencode(paths.existing(path))
        assert files.read(root, path, 1 << 20) == b"data of " + raw.rpartition(b"/")[2]
        files.delete(root, path)
        try:
            files.read(root, path, 1 << 20)
        except NotFound:
            continue
        raise AssertionError(f"{path} still there")
    assert [entry.path for entry in files.tree(root)] == ["ok"]
