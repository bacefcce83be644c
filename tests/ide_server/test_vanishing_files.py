"""A file removed while the tree or a run's copy-in lists its folder is left out, not a 500.

Under load an editor's temp file (written, then renamed over the real one) came and went between
listing a folder and reading an entry's details: the tree answered 500 and runs ended as
internal errors (issue 25).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ide_server.services import files
from sandbox import files as sandbox_files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "main.py").write_text("print(1)\n")
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / ".main.py.abc.codeyard-tmp").write_text("print(2)\n")
    return root


def remove_after_listing(monkeypatch: pytest.MonkeyPatch, module, victim: Path) -> None:
    """os.scandir as seen by `module`: the folder's entries, then `victim` disappears."""
    real_scandir = os.scandir

    class Listing:
        def __init__(self, where) -> None:
            with real_scandir(where) as entries:
                self.entries = list(entries)
            victim.unlink(missing_ok=True)

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc) -> None:
            return None

        def __iter__(self):
            return iter(self.entries)

    monkeypatch.setattr(module.os, "scandir", Listing)


def test_the_tree_leaves_out_a_file_removed_while_listing(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remove_after_listing(monkeypatch, files, project / ".main.py.abc.codeyard-tmp")
    assert [(e.path, e.kind) for e in files.tree(project)] == [
        ("main.py", "file"), ("pkg", "directory"), ("pkg/mod.py", "file")]


def test_copy_in_leaves_out_a_file_removed_while_listing(project: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    remove_after_listing(monkeypatch, sandbox_files, project / ".main.py.abc.codeyard-tmp")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    snapshot = sandbox_files.copy_in(project, workspace, max_bytes=1 << 20, max_files=100, owner=None)
    assert sorted(snapshot.files) == ["main.py", "pkg/mod.py"]
    assert (workspace / "pkg" / "mod.py").read_text() == "x = 1\n"
