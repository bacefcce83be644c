"""ProjectRuns: the service behind the runs API and the shell.

It joins the sandbox library (RunQueue, plan_run) to the app: who may see or steer a run (the
run's project decides), the run record kept in the database once it ends, and files the program
wrote going back into open editors through the collab rooms.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from collab.editors import OpenEditors
from ide_server.errors import DomainError, InvalidInput, PermissionDenied
from ide_server.models import Role, User
from ide_server.services import projects
from sandbox.backend import Backend, OutputChunk, RunSpec
from sandbox.errors import QueueFull, RunNotFound, SandboxError, SandboxUnavailable
from sandbox.languages import RunPlan, plan_run
from sandbox.limits import SERVER_MAXIMA
from sandbox.models import RunRow
from sandbox.packages.first import PackagesFirst
from sandbox.packages.install import Installer, InstallFailed
from sandbox.packages.project import REQUIREMENTS, PreparedPackages, add_packages, installed_for
from sandbox.packages.resolve import auto_install
from sandbox.preview import Preview, preview_path
from sandbox.run_queue import RunQueue, RunRecord, RunState, too_many_runs
from sandbox.schemas import PackagesPublic, RunCreate, RunPublic

log = logging.getLogger(__name__)

STORED_OUTPUT_CHARS = 64 * 1024  # per stream, in the database and in API answers
LIST_LIMIT = 50
INPUT_WAIT_SECONDS = 600.0  # an interactive run may wait this long for each input (the console says so)


def _time(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts is not None else None


def _bounded(text: str) -> tuple[str, bool]:
    return text[:STORED_OUTPUT_CHARS], len(text) > STORED_OUTPUT_CHARS


def public_of_record(record: RunRecord) -> RunPublic:
    data = record.public()
    stdout, cut_out = _bounded(data["stdout"])
    stderr, cut_err = _bounded(data["stderr"])
    return RunPublic(**{
        **data, "stdout": stdout, "stderr": stderr, "output_truncated": cut_out or cut_err,
        "created_at": _time(record.created_at), "started_at": _time(record.started_at),
        "finished_at": _time(record.finished_at),
    })


@dataclasses.dataclass(eq=False)
class HeldSocket:
    """A run or shell socket, open while its user keeps the access it was opened with."""

    project_id: str
    user_id: int
    check_access: Callable[[], None]  # asks the database (in a worker thread); raises once the access is gone
    revoked: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


def public_of_row(row: RunRow) -> RunPublic:
    return RunPublic.model_validate(row, from_attributes=True)


class ProjectRuns:
    """Runs of projects' code for signed-in users, on one backend (or none, with the reason)."""

    def __init__(self, backend: Backend | None, unavailable: str, *, sessions: sessionmaker[Session], projects_dir: Path,
                 editors: OpenEditors, installer: Installer | None = None, max_running: int, max_running_per_user: int,
                 max_per_user: int, server_id: str, max_queued: int = 64, max_shells: int = 16,
                 max_shells_per_user: int = 2, preview_tag: str = "",
                 announce: Callable[[str, dict[str, Any]], None] | None = None,
                 environment_of: Callable[[str], dict[str, str]] | None = None,
                 address_of: Callable[[str], Awaitable[str | None]] | None = None) -> None:
        """server_id: this server's, recorded with each run (see sandbox.server_presence); address_of: where
        another live server answers ("host:port"), to serve a run's socket from there. preview_tag: what
        begins its Webview tokens (Settings.worker_tag). announce: tells
        a project's open workspaces something (the events hub): a run started (so every member's console
        follows it), or a run wrote files (so their trees re-read). environment_of: a project's extra run
        environment (the secrets its owner exposes to runs), called in a worker thread."""
        self.backend, self.unavailable = backend, unavailable
        self.sessions, self.projects_dir, self.editors = sessions, projects_dir, editors
        self.installer, self.server_id = installer, server_id
        self.queue = RunQueue(PackagesFirst(backend, installer) if installer else backend, max_running=max_running,
                              max_running_per_user=max_running_per_user, max_queued=max_queued,
                              max_per_user=max_per_user) if backend else None
        self._finishers: set[asyncio.Task[None]] = set()
        self.max_shells, self.max_shells_per_user = max_shells, max_shells_per_user
        self.preview_tag = preview_tag
        self._shells: list[int] = []  # user id of each open shell
        self._previews: dict[str, tuple[RunRecord, Preview]] = {}  # run id -> the live run and its Webview
        self._sockets: set[HeldSocket] = set()
        self.announce: Callable[[str, dict[str, Any]], None] = announce or (lambda project_id, event: None)
        self.environment_of: Callable[[str], dict[str, str]] = environment_of or (lambda project_id: {})
        self.address_of = address_of

    def claim_shell(self, user: User) -> None:
        """Take one of the open-shell places (give it back with release_shell); QueueFull when none is free."""
        if self._shells.count(user.id) >= self.max_shells_per_user:
            raise QueueFull(f"you already have {self.max_shells_per_user} shells open; close one first")
        if len(self._shells) >= self.max_shells:
            raise QueueFull(f"the server has {self.max_shells} shells open; try again later")
        self._shells.append(user.id)

    def release_shell(self, user: User) -> None:
        self._shells.remove(user.id)

    def require_backend(self) -> Backend:
        if self.backend is None:
            raise SandboxUnavailable(self.unavailable)
        return self.backend

    def project_dir(self, project_id: str) -> Path:
        return projects.project_dir(self.projects_dir, project_id)

    def files_changed(self, project_id: str) -> None:
        """Open workspaces re-read the tree: a run or a Shell may have written files."""
        self.announce(project_id, {"type": "files", "action": "run", "path": "", "to": None})

    async def shell_packages(self, project_id: str) -> PreparedPackages:
        """What the Shell mounts so it sees the packages runs see (those installed; the Shell installs nothing)."""
        if self.installer is None:
            return PreparedPackages()
        return await asyncio.to_thread(installed_for, self.installer, self.project_dir(project_id))

    async def start(self, user: User, project_id: str, body: RunCreate) -> RunPublic:
        """Plan and queue a run of the project; QueueFull (429) when too many are waiting."""
        self.require_backend()
        assert self.queue is not None
        await self.editors.checkpoint(project_id, "Checkpoint before a run")
        project_dir = self.project_dir(project_id)
        try:
            plan, env = await asyncio.to_thread(self._admit_and_prepare, user.id, project_id, project_dir, body.entry)
            limits = plan.limits.with_overrides(body.limits, SERVER_MAXIMA)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        interactive = body.interactive and body.stdin is None
        preview = Preview(self.preview_tag) if interactive else None
        try:
            spec = RunSpec(plan.argv, project_dir, limits, {**(preview.environment() if preview else {}), **env},
                           mounts=(preview.mount(),) if preview else (), wrapper=preview.wrapper() if preview else (),
                           input_wait_seconds=INPUT_WAIT_SECONDS if interactive else None)
            record = await self.queue.submit(str(user.id), project_id, spec)
        except BaseException:
            if preview is not None:
                preview.close()
            raise
        if preview is not None:
            self._previews[record.id] = (record, preview)
        await asyncio.to_thread(self._insert, record, project_id, user.id)
        if body.stdin is not None:
            await self.queue.send_stdin(record.id, body.stdin.encode())
            await self.queue.close_stdin(record.id)
        task = asyncio.create_task(self._finish(record, preview))
        self._finishers.add(task)
        task.add_done_callback(self._finishers.discard)
        self.announce(project_id, {"type": "run", "id": record.id, "username": user.username, "argv": record.argv,
                                   "interactive": interactive})
        return self._public(record, user)

    def preview_url(self, record: RunRecord, user_id: str) -> str | None:
        """While the run serves HTTP: where its Webview opens it for this member (their own token)."""
        live = self._previews.get(record.id)
        if live is None or record.listening_port is None:
            return None
        return preview_path(live[1].token_for(user_id))

    def preview_of(self, token: str) -> tuple[RunRecord, Preview, str] | None:
        """The live run a Webview token opens, its Webview and the member the token was given to."""
        for record, preview in self._previews.values():
            if (user_id := preview.user_of(token)) is not None:
                return record, preview, user_id
        return None

    def still_member(self, record: RunRecord, user_id: str) -> bool:
        """Whether a Webview token's member is still a member of the run's project (asked on each Webview
        request, in a worker thread: the events hub's notice may come late, or from another replica)."""
        return self._role(record.project_id, int(user_id)) is not None

    def revoke_previews(self, project_id: str, user_id: str) -> None:
        """A member left the project: their Webview tokens of its runs stop working, their WebSockets end."""
        for record, preview in list(self._previews.values()):
            if record.project_id == project_id:
                preview.revoke(user_id)

    async def access_changed(self, project_id: str, user_id: int) -> None:
        """The events hub's notice of a membership change: a removed member's Webviews close at once, and
        their run and shell sockets too (a downgraded editor's shell and typing sockets as well)."""
        if await asyncio.to_thread(self._role, project_id, user_id) is None:
            self.revoke_previews(project_id, str(user_id))
        for held in [h for h in self._sockets if h.project_id == project_id and h.user_id == user_id]:
            try:
                await asyncio.to_thread(held.check_access)
            except (DomainError, SandboxError):
                held.revoked.set()

    @contextmanager
    def holding(self, project_id: str, user_id: int, check_access: Callable[[], None]) -> Iterator[asyncio.Event]:
        """Register a run or shell socket for the time it is open; the event is set when a membership change
        takes away the access it was opened with (the socket then closes with 4403)."""
        held = HeldSocket(project_id, user_id, check_access)
        self._sockets.add(held)
        try:
            yield held.revoked
        finally:
            self._sockets.discard(held)

    def _role(self, project_id: str, user_id: int) -> Role | None:
        with self.sessions() as db:
            return projects.role_of(db, project_id, db.get(User, user_id))

    async def updates_for(self, record: RunRecord, user: User) -> AsyncIterator[OutputChunk | RunState]:
        """The run's output and state changes as `user` sees them (with their own Webview address)."""
        assert self.queue is not None
        async for update in self.queue.updates(record.id):
            if isinstance(update, RunState):
                update = dataclasses.replace(update, preview_url=self.preview_url(record, str(user.id)))
            yield update

    def _public(self, record: RunRecord, user: User) -> RunPublic:
        return public_of_record(record).model_copy(update={"preview_url": self.preview_url(record, str(user.id))})

    async def add_packages(self, project_id: str, names: list[str]) -> PackagesPublic:
        """Install PyPI packages into the project's environment and list them in its requirements.txt."""
        if self.installer is None:
            raise SandboxUnavailable(self.unavailable or "package installs are off on this server (see its log)")
        await self.editors.flush(project_id)
        project_dir = self.project_dir(project_id)
        try:
            env = await add_packages(self.installer, project_dir, names)
        except (ValueError, InstallFailed) as exc:
            raise InvalidInput(str(exc)) from None
        lines = (project_dir / REQUIREMENTS).read_text().splitlines()
        return PackagesPublic(requirements=lines, installed=env.pins)

    async def _finish(self, record: RunRecord, preview: Preview | None) -> None:
        """When the run ends, close its Webview and store its outcome."""
        assert self.queue is not None
        await self.queue.wait(record.id)
        if preview is not None:
            del self._previews[record.id]
            preview.close()
        self.files_changed(record.project_id)  # what it wrote, and declarations its package installs pinned
        try:
            if record.result is not None:
                await self.editors.files_written(record.project_id, record.result.files_written)
            await asyncio.to_thread(self._store, record)
        except Exception:
            log.exception("could not finish run %s", record.id)

    def _prepare(self, project_id: str, project_dir: Path, entry: str | None) -> tuple[RunPlan, dict[str, str]]:
        """In one worker-thread hop (a run start waits for each hop's turn on a busy event loop): the
        plan, the packages' check (a bad [packages] answers 400 too, not a failed run later), the
        project's run environment."""
        plan = plan_run(project_dir, entry)
        auto_install(project_dir)
        return plan, self.environment_of(project_id)

    def _admit_and_prepare(self, user_id: int, project_id: str, project_dir: Path, entry: str | None
                           ) -> tuple[RunPlan, dict[str, str]]:
        """In one worker-thread hop: the user's runs on every server sharing the database (each worker or
        replica queues its own, so its queue's count alone let a user hold N times as many), then the plan."""
        assert self.queue is not None
        with self.sessions() as db:
            active = db.scalar(select(func.count()).select_from(RunRow).where(
                RunRow.user_id == user_id, RunRow.status != "finished")) or 0
        if active >= self.queue.max_per_user:
            raise too_many_runs(self.queue.max_per_user)
        return self._prepare(project_id, project_dir, entry)

    def _insert(self, record: RunRecord, project_id: str, user_id: int) -> None:
        """In a worker thread: a write waits for SQLite's write lock, which the event loop must never do."""
        with self.sessions() as db, db.begin():
            db.add(RunRow(id=record.id, project_id=project_id, user_id=user_id, argv=record.argv, status="queued",
                          created_at=_time(record.created_at), server_id=self.server_id))

    def _store(self, record: RunRecord) -> None:
        public = public_of_record(record)
        with self.sessions() as db, db.begin():
            row = db.get(RunRow, record.id)
            if row is None:
                return  # the project was deleted meanwhile
            for name in ("status", "verdict", "exit_code", "signal", "cpu_seconds", "wall_seconds", "peak_memory_bytes",
                         "stdout", "stderr", "output_truncated", "files_written", "message", "started_at", "finished_at"):
                setattr(row, name, getattr(public, name))

    def _visible(self, db: Session, run_id: str, user: User, min_role: Role) -> tuple[str, RunRecord | None, RunRow | None]:
        """The run's project id, live record and row, if `user` has `min_role` on that project.

        Runs of projects the caller is not a member of answer 404, as if they didn't exist."""
        record = None
        if self.queue is not None:
            try:
                record = self.queue.get(run_id)
            except RunNotFound:
                pass
        row = db.get(RunRow, run_id) if record is None else None
        project_id = record.project_id if record else row.project_id if row else None
        if project_id is None:
            raise RunNotFound(f"run {run_id} not found")
        role = projects.role_of(db, project_id, user)
        if role is None:
            raise RunNotFound(f"run {run_id} not found")
        if not role.at_least(min_role):
            raise PermissionDenied(f"this needs the {min_role.value} role on the run's project")
        return project_id, record, row

    def get(self, db: Session, run_id: str, user: User) -> RunPublic:
        _, record, row = self._visible(db, run_id, user, Role.viewer)
        if record is not None:
            return self._public(record, user)
        assert row is not None  # a run _visible found is live or in the table
        return public_of_row(row)

    def check(self, db: Session, run_id: str, user: User, min_role: Role = Role.viewer) -> None:
        """Raise RunNotFound/PermissionDenied unless `user` may see (or steer) the live run."""
        _, record, _ = self._visible(db, run_id, user, min_role)
        if record is None:
            raise RunNotFound(f"run {run_id} is over; read it with GET /api/runs/{run_id}")

    async def elsewhere(self, run_id: str, user: User) -> str | None:
        """Where the run is live if another server runs it ("host:port"): replicas, `serve --workers`.
        None when it is ours, over, or its server is gone; RunNotFound for non-members, as everywhere."""
        if self.address_of is None:  # a server alone: every live run is its own
            return None
        server = await asyncio.to_thread(self._other_server, run_id, user)
        return await self.address_of(server) if server else None

    def _other_server(self, run_id: str, user: User) -> str | None:
        with self.sessions() as db:
            _, record, row = self._visible(db, run_id, user, Role.viewer)
        if record is not None or row is None or row.status == "finished" or row.server_id == self.server_id:
            return None
        return row.server_id

    def cancel_run(self, run_id: str, user: User) -> RunPublic:
        """cancel on a session of its own (blocking: in a worker thread)."""
        with self.sessions() as db:
            return self.cancel(db, run_id, user)

    def cancel(self, db: Session, run_id: str, user: User) -> RunPublic:
        _, record, row = self._visible(db, run_id, user, Role.editor)
        if record is None:
            assert row is not None  # a run _visible found is live or in the table
            return public_of_row(row)  # already over: nothing to cancel
        assert self.queue is not None
        return self._public(self.queue.cancel(run_id), user)

    def list(self, db: Session, project_id: str, user: User) -> list[RunPublic]:
        """The project's latest runs, newest first (live ones with their current state)."""
        rows = db.execute(select(RunRow, User.username).outerjoin(User, User.id == RunRow.user_id)
                          .where(RunRow.project_id == project_id).order_by(RunRow.created_at.desc()).limit(LIST_LIMIT)).all()
        answer = []
        for row, username in rows:
            try:
                record = self.queue.get(row.id) if self.queue else None
            except RunNotFound:
                record = None
            public = self._public(record, user) if record else public_of_row(row)
            answer.append(public.model_copy(update={"username": username}))
        return answer

    def unfinished_servers(self) -> set[str | None]:
        """The servers following unfinished runs (None: a run recorded before runs named their server)."""
        with self.sessions() as db:
            return set(db.scalars(select(RunRow.server_id).where(RunRow.status != "finished").distinct()))

    def close_runs_of(self, servers: set[str | None]) -> int:
        """Unfinished runs of these stopped servers end as internal_error (their server would store the outcome)."""
        whose = [RunRow.server_id.in_({server for server in servers if server is not None})]
        if None in servers:
            whose.append(RunRow.server_id.is_(None))
        with self.sessions() as db, db.begin():
            rows = db.scalars(select(RunRow).where(RunRow.status != "finished", or_(*whose))).all()
            for row in rows:
                row.status, row.verdict = "finished", "internal_error"
                row.message, row.finished_at = "the server stopped during this run", datetime.now(UTC)
            return len(rows)

    async def shutdown(self) -> None:
        if self.queue is not None:
            await self.queue.shutdown()
        await asyncio.gather(*self._finishers, return_exceptions=True)
