"""Project history in git: checkpoints with the editing users as authors, reads, diffs, restores.

Each project folder is the work tree of its own git repository, whose git folder lives outside
the project (in the server's data folder): users can write any file of their project, and a
`.git/config` or hook they wrote must never run on the server when it commits (core.fsmonitor,
hooks...). Checkpoints are commits of the whole folder; the
first editing user is the commit author and the others are `Co-authored-by:` trailers. Restores
go through the rooms (RoomManager.set_text), so everyone editing sees the old text arrive as an
ordinary edit and nobody's connection has to reload.
"""

from __future__ import annotations

import asyncio
import builtins
import fcntl
import functools
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import git

from collab.room import RoomKey
from collab.rooms import RoomManager
from ide_server import paths

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
VERSION_PATTERN = re.compile(r"^[0-9a-f]{4,40}$")


# What `git commit` prints (in the C locale) when the index equals HEAD; the second when, besides, a file
# changed after `git add` (a save landing in between, whose own checkpoint follows).
NOTHING_TO_COMMIT = ("nothing to commit", "no changes added to commit")


class NameTaken(ValueError):
    """Another checkpoint already has this name."""


@dataclass(frozen=True)
class Author:
    name: str
    email: str


SERVER = Author("Codeyard", "codeyard@localhost")  # the committer, and the author of checkpoints nobody edited


def user_author(username: str) -> Author:
    """How a Codeyard user appears in a project's git history."""
    return Author(username, f"{username}@users.codeyard")


@dataclass(frozen=True)
class Checkpoint:
    version: str
    message: str
    authors: tuple[Author, ...]
    created_at: datetime
    names: tuple[str, ...]


P = ParamSpec("P")
R = TypeVar("R")


def _serialised(method: Callable[Concatenate[ProjectHistory, P], R]) -> Callable[Concatenate[ProjectHistory, P], R]:
    """One caller at a time: in this process (GitPython keeps long-lived `git cat-file` pipes per Repo) and
    across the processes sharing the data dir (`serve --workers`, replicas on one machine), whose `git add`s
    of one project would otherwise meet on its index.lock ("adding files failed")."""

    @functools.wraps(method)
    def locked(self: ProjectHistory, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            outermost = self._depth == 0
            if outermost:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX)
            self._depth += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                self._depth -= 1
                if outermost:
                    fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    return locked


class ProjectHistory:
    """Git operations on one project folder (blocking; call them from a worker thread).

    Keep one instance per project: its methods are serialised, so an automatic checkpoint and
    an API read never talk to the same git pipes at once.
    """

    def __init__(self, project_dir: Path, git_dir: Path) -> None:
        self.project_dir = project_dir
        self._lock = threading.RLock()
        if not (git_dir / "HEAD").is_file():
            repo = git.Repo.init(git_dir, mkdir=True, bare=True, initial_branch="main")
            with repo.config_writer() as config:
                config.set_value("core", "bare", "false")
                config.set_value("core", "worktree", str(project_dir.resolve()))
        self.repo = git.Repo(git_dir)
        self._lock_file = os.open(git_dir / "codeyard.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._depth = 0  # nested calls of this thread under the lock
        # Every git command names both folders, so nothing is looked up from the project folder.
        self.repo.git.update_environment(GIT_DIR=str(git_dir.resolve()), GIT_WORK_TREE=str(project_dir.resolve()))

    @_serialised
    def checkpoint(self, message: str, authors: list[Author], name: str | None = None) -> Checkpoint | None:
        """Commit every change in the project; None when nothing changed and no name was asked for."""
        if name is not None:
            self._check_name(name)
        self.repo.git.add(A=True)
        # Commit straight away and let git say whether anything changed: a `diff --cached` first
        # was a third git process per checkpoint, and a checkpoint comes before every run.
        lead = authors[0] if authors else SERVER
        trailers = "".join(f"\nCo-authored-by: {a.name} <{a.email}>" for a in authors[1:])
        status, out, err = self.repo.git.commit(
            "--quiet", "--no-verify", "--allow-empty-message", "--cleanup=verbatim",
            "-m", message + ("\n" + trailers if trailers else ""), f"--author={lead.name} <{lead.email}>",
            env={"GIT_COMMITTER_NAME": SERVER.name, "GIT_COMMITTER_EMAIL": SERVER.email, "LC_ALL": "C"},
            with_exceptions=False, with_extended_output=True)
        if status != 0 and not any(nothing in out for nothing in NOTHING_TO_COMMIT):
            raise git.GitCommandError("git commit", status, err or out)
        if status != 0 and name is None:
            return None
        if name is not None:
            self.repo.create_tag(name, ref=self.repo.head.commit)
        return self._checkpoint(self.repo.head.commit)

    @_serialised
    def name(self, version: str, name: str) -> Checkpoint:
        """Give a checkpoint a name (a git tag) to find it again."""
        self._check_name(name)
        commit = self._commit(version)
        self.repo.create_tag(name, ref=commit)
        return self._checkpoint(commit)

    @_serialised
    def list(self, path: str | None = None, limit: int = 100) -> list[Checkpoint]:
        """Newest first; with path, only checkpoints that changed that file."""
        if not self.repo.head.is_valid():
            return []
        commits = self.repo.iter_commits("HEAD", paths=path or "", max_count=limit)
        return [self._checkpoint(commit) for commit in commits]

    @_serialised
    def has_checkpoints(self) -> bool:
        return self.repo.head.is_valid()

    @_serialised
    def read(self, version: str, path: str) -> bytes:
        try:
            blob = self._commit(version).tree / path
        except KeyError as exc:
            raise FileNotFoundError(f"path: {path} is not in version {version}") from exc
        data: bytes = blob.data_stream.read()
        return data

    @_serialised
    def files(self, version: str) -> builtins.list[str]:  # (`list` is the method above here)
        return sorted(str(item.path) for item in self._commit(version).tree.traverse() if isinstance(item, git.Blob))

    @_serialised
    def diff(self, old: str, new: str, path: str | None = None) -> str:
        """Unified diff between two versions (of one file, or the whole project)."""
        args = [self._commit(old).hexsha, self._commit(new).hexsha]
        text: str = self.repo.git.diff(*args, "--", *([path] if path else []))
        # GitPython keeps bytes that are not UTF-8 as lone surrogates, which no JSON answer can carry
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    def _commit(self, version: str) -> git.Commit:
        if not (VERSION_PATTERN.match(version) or NAME_PATTERN.match(version)):
            raise ValueError(f"version: {version!r} is not a checkpoint id or name")
        try:
            return self.repo.commit(version)
        except (git.BadName, ValueError) as exc:
            raise ValueError(f"version: no checkpoint {version!r}") from exc

    def _checkpoint(self, commit: git.Commit) -> Checkpoint:
        authors = [Author(commit.author.name or "", commit.author.email or "")]
        message = commit.message if isinstance(commit.message, str) else commit.message.decode("utf-8", "replace")
        for line in message.splitlines():
            if match := re.match(r"^Co-authored-by: (.+) <(.+)>$", line):
                authors.append(Author(match[1], match[2]))
        names = tuple(tag.name for tag in self.repo.tags if tag.commit == commit)
        summary = message.split("\n\nCo-authored-by:")[0].strip()
        return Checkpoint(
            commit.hexsha, summary, tuple(authors), datetime.fromtimestamp(commit.committed_date, UTC), names
        )

    def _check_name(self, name: str) -> None:
        if not NAME_PATTERN.match(name):
            raise ValueError("name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        if name in self.repo.tags:
            raise NameTaken(f"name: another checkpoint is already called {name!r}")


class Histories:
    """The ProjectHistory of each project, created on first use (one per project, see above)."""

    def __init__(self, project_dir_of: Callable[[str], Path], git_dir_of: Callable[[str], Path]) -> None:
        self._project_dir_of = project_dir_of
        self._git_dir_of = git_dir_of
        self._by_project: dict[str, ProjectHistory] = {}
        self._lock = threading.Lock()

    def of(self, project_id: str) -> ProjectHistory:
        with self._lock:
            if project_id not in self._by_project:
                self._by_project[project_id] = ProjectHistory(
                    self._project_dir_of(project_id), self._git_dir_of(project_id)
                )
            return self._by_project[project_id]


async def restore_file(history: ProjectHistory, rooms: RoomManager, key: RoomKey, version: str) -> None:
    """Put a file back to its text at version, as a live edit everyone in the room sees."""
    data = await asyncio.to_thread(history.read, version, key.file_path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"path: {key.file_path} is not a text file") from exc
    await rooms.set_text(key, text)


async def restore_project(history: ProjectHistory, rooms: RoomManager, project_id: str, version: str) -> None:
    """Every file back to version: text files through their rooms, others written directly."""
    wanted = await asyncio.to_thread(history.files, version)
    current = await asyncio.to_thread(history.files, "HEAD") if history.has_checkpoints() else []
    for path in wanted:
        data = await asyncio.to_thread(history.read, version, path)
        target = history.project_dir / path
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        # a name the API cannot carry (not UTF-8...) has no room: no editor can open it, and the store can't key it
        if text is not None and target.is_file() and paths.problem(path) is None:
            await rooms.set_text(RoomKey(project_id, path), text)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(target.write_bytes, data)
    for path in set(current) - set(wanted):
        if paths.problem(path) is None:
            await rooms.forget(RoomKey(project_id, path))
        (history.project_dir / path).unlink(missing_ok=True)


class AutoCheckpointer:
    """Commits a project once its editing pauses, with the users who edited as authors."""

    def __init__(
        self,
        rooms: RoomManager,
        history_of: Callable[[str], ProjectHistory],
        author_of: Callable[[str], Author],
        *,
        pause_s: float = 30.0,
    ) -> None:
        self.rooms = rooms
        self.history_of = history_of
        self.author_of = author_of
        self.pause_s = pause_s
        self._editors: dict[str, list[str]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Checkpoint | None]] = set()

    def edited(self, key: RoomKey, user_id: str) -> None:
        """RoomManager's on_edit hook: (re)start the pause timer of the project."""
        project_id = key.project_id
        editors = self._editors.setdefault(project_id, [])
        if user_id not in editors:
            editors.append(user_id)
        if timer := self._timers.pop(project_id, None):
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[project_id] = loop.call_later(self.pause_s, self._start_checkpoint, project_id)

    async def checkpoint_now(self, project_id: str, message: str) -> Checkpoint | None:
        """On run, on deploy, or on demand: commit what changed, crediting who edited it."""
        if timer := self._timers.pop(project_id, None):
            timer.cancel()
        user_ids = self._editors.pop(project_id, [])
        await self.rooms.flush_project(project_id)
        # The authors' lookups and git (history_of may create the repository) in one worker-thread
        # hop: a run waits for this, and under a class's load each hop back to the loop cost a turn.
        return await asyncio.to_thread(
            lambda: self.history_of(project_id).checkpoint(message, [self.author_of(u) for u in user_ids]))

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start_checkpoint(self, project_id: str) -> None:
        self._timers.pop(project_id, None)
        task = asyncio.create_task(self.checkpoint_now(project_id, "Checkpoint after a pause in editing"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
