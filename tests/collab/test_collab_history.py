"""Project history in git: checkpoints with authors, reads, diffs, names, restores seen live."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from collab_testkit import PyClient
from waiting import eventually

from collab.history import Author, AutoCheckpointer, ProjectHistory, restore_file, restore_project
from collab.room import RoomKey
from collab.rooms import RoomManager
from collab.store import UpdateStore

ALICE = Author("Alice", "alice@example.org")
BOB = Author("Bob Émile", "bob@example.org")


@pytest.fixture
def project(project_root: Path, project_id: str) -> Path:
    folder = project_root / project_id
    (folder / "src").mkdir()
    (folder / "src" / "main.py").write_text("print('v1 😀')\n", encoding="utf-8")
    (folder / "README.md").write_text("# demo\n", encoding="utf-8")
    return folder


@pytest.fixture
def git_dir(tmp_path: Path) -> Path:
    return tmp_path / "history" / "project.git"


@pytest.fixture
async def rooms(store: UpdateStore, project_root: Path):
    manager = RoomManager(store, lambda k: project_root / k.project_id / k.file_path, idle_unload_s=0.2)
    yield manager
    await manager.shutdown()


def test_checkpoints_list_read_diff_and_names(project: Path, git_dir: Path) -> None:
    history = ProjectHistory(project, git_dir)
    first = history.checkpoint("Start", [ALICE, BOB], name="v1")
    assert first and first.authors == (ALICE, BOB) and first.message == "Start" and first.names == ("v1",)
    assert history.checkpoint("Nothing changed", [ALICE]) is None

    (project / "src" / "main.py").write_text("print('v2 😀')\n", encoding="utf-8")
    second = history.checkpoint("Second", [BOB])
    (project / "README.md").write_text("# demo\nmore\n", encoding="utf-8")
    third = history.checkpoint("Third", [])
    assert third.authors == (Author("Codeyard", "codeyard@localhost"),)

    assert [c.version for c in history.list()] == [third.version, second.version, first.version]
    assert [c.version for c in history.list("src/main.py")] == [second.version, first.version]
    assert history.read("v1", "src/main.py").decode() == "print('v1 😀')\n"
    assert history.read(second.version[:8], "src/main.py").decode() == "print('v2 😀')\n"
    diff = history.diff("v1", third.version, "src/main.py")
    assert "-print('v1 😀')" in diff and "+print('v2 😀')" in diff and "README" not in diff
    assert history.name(second.version, "before-readme").names == ("before-readme",)

    with pytest.raises(ValueError, match="name"):
        history.name(second.version, "../evil")
    with pytest.raises(ValueError, match="version"):
        history.read("nope-nope", "src/main.py")
    with pytest.raises(FileNotFoundError):
        history.read("v1", "missing.txt")


def test_files_users_write_into_the_project_never_configure_the_servers_git(
    project: Path, git_dir: Path, tmp_path: Path
) -> None:
    """The git folder is outside the project: a planted .git/config (core.fsmonitor runs a
    command on `git add`) or hook is just another project file to the server's git."""
    proof = tmp_path / "ran"
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "config").write_text(f"[core]\n\tfsmonitor = touch {proof}\n", encoding="utf-8")
    hook = project / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {proof}\n", encoding="utf-8")
    hook.chmod(0o755)
    history = ProjectHistory(project, git_dir)
    first = history.checkpoint("v1", [ALICE])
    (project / "README.md").write_text("# changed\n", encoding="utf-8")
    assert history.checkpoint("v2", [ALICE]) is not None
    assert not proof.exists()
    assert (git_dir / "HEAD").is_file() and "README.md" in history.files(first.version)
    assert not any(path.startswith(".git") for path in history.files("HEAD"))


async def test_restoring_a_file_reaches_connected_clients_live(
    project: Path, project_id: str, rooms: RoomManager, git_dir: Path
) -> None:
    history = ProjectHistory(project, git_dir)
    v1 = history.checkpoint("v1", [ALICE])
    key = RoomKey(project_id, "src/main.py")
    alice = PyClient(rooms, key, "alice")
    await alice.start()
    await eventually(lambda: str(alice.text) == "print('v1 😀')\n")
    alice.type(len("print('v1 😀')\n".encode()), "print('v2')\n")
    await eventually(lambda: (project / "src" / "main.py").read_text(encoding="utf-8").endswith("print('v2')\n"))

    await restore_file(history, rooms, key, v1.version)
    await eventually(lambda: str(alice.text) == "print('v1 😀')\n")
    assert (project / "src" / "main.py").read_text(encoding="utf-8") == "print('v1 😀')\n"
    await alice.leave()


async def test_restoring_the_project_brings_back_files_and_removes_new_ones(
    project: Path, project_id: str, rooms: RoomManager, git_dir: Path
) -> None:
    history = ProjectHistory(project, git_dir)
    v1 = history.checkpoint("v1", [ALICE])
    (project / "README.md").unlink()
    (project / "new.txt").write_text("new\n", encoding="utf-8")
    (project / "src" / "main.py").write_text("changed\n", encoding="utf-8")
    history.checkpoint("changes", [BOB])

    await restore_project(history, rooms, project_id, v1.version)
    assert (project / "README.md").read_text(encoding="utf-8") == "# demo\n"
    assert (project / "src" / "main.py").read_text(encoding="utf-8") == "print('v1 😀')\n"
    assert not (project / "new.txt").exists()


async def test_pause_in_editing_commits_with_the_editors_as_authors(
    project: Path, project_id: str, rooms: RoomManager, git_dir: Path
) -> None:
    history = ProjectHistory(project, git_dir)
    history.checkpoint("v1", [])
    authors = {"alice": ALICE, "bob": BOB}

    def author_of(user_id: str) -> Author:
        return authors[user_id]

    checkpointer = AutoCheckpointer(rooms, lambda pid: history, author_of, pause_s=0.3)
    rooms.on_edit = checkpointer.edited
    key = RoomKey(project_id, "src/main.py")
    alice, bob = PyClient(rooms, key, "alice"), PyClient(rooms, key, "bob")
    await alice.start()
    await bob.start()
    await eventually(lambda: str(alice.text) == str(bob.text) == "print('v1 😀')\n")
    alice.type(0, "# alice\n")
    bob.type(0, "# bob\n")
    await eventually(lambda: len(history.list()) == 2, timeout=5)
    latest = history.list()[0]
    assert set(latest.authors) == {ALICE, BOB}
    assert history.read(latest.version, "src/main.py").decode() == str(alice.text)
    await alice.leave()
    await bob.leave()
    await checkpointer.close()


def _checkpoint_often(project: Path, git_dir: Path, who: str, times: int) -> str:
    """In its own process (as a `serve --workers` worker is): write a file and checkpoint, `times` times."""
    history = ProjectHistory(project, git_dir)
    try:
        for i in range(times):
            (project / f"{who}.txt").write_text(f"{who} {i}\n")
            history.checkpoint(f"{who} {i}", [Author(who, f"{who}@example.org")])
    except Exception as exc:  # noqa: BLE001 - what the other process's git said, for the assertion
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_processes_sharing_a_project_take_turns_at_its_git(project: Path, git_dir: Path) -> None:
    """Two workers checkpointing one project at once (a run's checkpoint in one, a pause's in the other) met on
    git's index.lock: "adding files failed", a 500 on the run. Now each checkpoint waits for the other's."""
    ProjectHistory(project, git_dir).checkpoint("Start", [ALICE])
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        outcomes = pool.starmap(_checkpoint_often, [(project, git_dir, name, 25) for name in ("one", "two")])
    assert outcomes == ["ok", "ok"]
    history = ProjectHistory(project, git_dir)
    latest = history.list()[0].version  # each one's last write is in a checkpoint (its own or the other's)
    assert [history.read(latest, f"{name}.txt") for name in ("one", "two")] == [b"one 24\n", b"two 24\n"]
