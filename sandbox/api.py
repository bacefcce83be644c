"""Runs as an ide_server component: the runs API, the run and shell WebSockets, and their lifespan.

Handlers are thin; `ProjectRuns` holds the rules. The WebSockets accept first and then check
access, closing with 4401 (not signed in), 4404 (no such run or project for this caller) or 4403
(a viewer trying to steer), so a browser can tell the cases apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, FastAPI, Query, WebSocket, status
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse

from collab.editors import OpenEditors
from ide_server.components import Component
from ide_server.deps import CurrentUser, DbSession, ProjectEditor, ProjectMember, authenticate_websocket
from ide_server.error_handlers import ERROR_RESPONSES, answer_like_domain_errors
from ide_server.errors import DomainError, NotAuthenticated, PermissionDenied
from ide_server.events import ProjectEvents
from ide_server.models import Role, User
from ide_server.schemas import RandomId
from ide_server.services import projects
from ide_server.wiring import Builders, Collab, Core, RunSecrets, required, services_of
from sandbox.backends.choice import make_backend
from sandbox.backends.dockerd import docker_client
from sandbox.errors import RunNotFound, SandboxError, SandboxUnavailable
from sandbox.frames import (
    CLOSE_BUSY,
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    CLOSE_UNAVAILABLE,
    SOCKET_GONE,
    receive_frame,
    send_chunks,
)
from sandbox.host_lease import HostLease
from sandbox.packages.install import bubblewrap_installer, runners_installer
from sandbox.run_queue import RunQueue
from sandbox.run_relay import forward_post, serve_from
from sandbox.runner import start_own_runner
from sandbox.schemas import PackagesAdd, PackagesPublic, RunCreate, RunPublic
from sandbox.server_presence import OrphanedRuns, SharedPresence, server_presence
from sandbox.service import ProjectRuns, public_of_record
from sandbox.shell import serve_shell
from sandbox.sweep import sweep

log = logging.getLogger(__name__)
router = APIRouter(tags=["runs"], responses={**ERROR_RESPONSES, 503: {"description": "No sandbox on this server"}})


def runs_of(conn: HTTPConnection) -> ProjectRuns:
    return required(services_of(conn.app.state).runs, "sandbox")


async def _runs(conn: HTTPConnection) -> ProjectRuns:
    """Async, as every dependency without I/O: a sync one costs a worker-thread hop per request."""
    return runs_of(conn)


Runs = Annotated[ProjectRuns, Depends(_runs)]


@router.post("/api/projects/{project_id}/runs", status_code=status.HTTP_202_ACCEPTED)
async def start_run(body: RunCreate, ctx: ProjectEditor, runs: Runs) -> RunPublic:
    """Queue a run of the project (its entry file, or codeyard.toml's [run]); follow it on /ws/runs/{id}."""
    assert ctx.user is not None  # an editor is signed in
    return await runs.start(ctx.user, ctx.project.id, body)


@router.post("/api/projects/{project_id}/packages")
async def add_packages(body: PackagesAdd, ctx: ProjectEditor, runs: Runs) -> PackagesPublic:
    """Install PyPI packages (names only) for the project, sandboxed, and pin them in requirements.txt."""
    return await runs.add_packages(ctx.project.id, body.names)


@router.get("/api/projects/{project_id}/runs")
def list_runs(ctx: ProjectMember, db: DbSession, runs: Runs) -> list[RunPublic]:
    """The project's latest 50 runs, newest first."""
    assert ctx.user is not None  # a member is signed in
    return runs.list(db, ctx.project.id, ctx.user)


@router.get("/api/runs/{run_id}")
def get_run(run_id: RandomId, user: CurrentUser, db: DbSession, runs: Runs) -> RunPublic:
    """Status, verdict, output and usage of a run of a project you are a member of."""
    return runs.get(db, run_id, user)


@router.post("/api/runs/{run_id}/cancel", response_model=RunPublic)
async def cancel_run(run_id: RandomId, user: CurrentUser, request: Request, runs: Runs) -> RunPublic | JSONResponse:
    """Stop a queued or running run (editors of its project); a finished run is returned as it is."""
    if (address := await runs.elsewhere(run_id, user)) is not None:
        return await forward_post(request, address)  # live on another replica or worker
    return await run_in_threadpool(runs.cancel_run, run_id, user)


def _caller(websocket: WebSocket) -> User:
    with websocket.app.state.sessionmaker() as db:
        user = authenticate_websocket(websocket, db, websocket.app.state.settings)
    if user is None:
        raise NotAuthenticated("sign in first")
    return user


async def _until_revoked(revoked: asyncio.Event, work: Callable[[], Awaitable[None]]) -> bool:
    """Run work until it ends or the socket's access is revoked (work is then cancelled); True when revoked."""
    async with anyio.create_task_group() as tasks:
        async def run() -> None:
            await work()
            tasks.cancel_scope.cancel()

        async def watch() -> None:
            await revoked.wait()
            tasks.cancel_scope.cancel()

        tasks.start_soon(run)
        tasks.start_soon(watch)
    return revoked.is_set()


async def _close_revoked(websocket: WebSocket) -> None:
    with suppress(*SOCKET_GONE):
        await websocket.close(CLOSE_FORBIDDEN, "access revoked")


async def _close_denied(websocket: WebSocket, exc: DomainError | SandboxError) -> None:
    code = {401: CLOSE_UNAUTHENTICATED, 403: CLOSE_FORBIDDEN, 429: CLOSE_BUSY, 503: CLOSE_UNAVAILABLE}.get(exc.status_code, CLOSE_NOT_FOUND)
    await websocket.close(code, exc.detail[:120])


@router.websocket("/ws/runs/{run_id}")
async def run_socket(websocket: WebSocket, run_id: str) -> None:
    """Output frames {"type": "stdout"|"stderr"|"install" (package installs before it starts), "data"}, state frames
    {"type": "status", "status": "queued"|"running", "queue_position", "waiting_for_input"} as it changes, then {"type": "exit", ...the run...};
    editors may send {"type": "stdin", "data"} and {"type": "stdin_eof"}."""
    await websocket.accept()
    runs = runs_of(websocket)
    user: User | None = None
    try:
        user = await run_in_threadpool(_caller, websocket)

        def allowed() -> bool:
            with websocket.app.state.sessionmaker() as db:
                runs.check(db, run_id, user)
                try:
                    runs.check(db, run_id, user, Role.editor)
                    return True
                except PermissionDenied:
                    return False

        can_write = await run_in_threadpool(allowed)
    except RunNotFound as exc:  # not live here: perhaps on another replica or worker, or over
        address = await _elsewhere(runs, run_id, user)
        if address is not None:
            await serve_from(websocket, address)
        elif not await _replayed(websocket, runs, run_id, user):
            await _close_denied(websocket, exc)
        return
    except (DomainError, SandboxError) as exc:
        await _close_denied(websocket, exc)
        return

    def check_access() -> None:  # a non-member is told RunNotFound, like for a run that is over
        with websocket.app.state.sessionmaker() as db:
            runs.check(db, run_id, user, Role.editor if can_write else Role.viewer)

    await _stream_run(websocket, runs, run_id, user, can_write, check_access)


async def _elsewhere(runs: ProjectRuns, run_id: str, user: User | None) -> str | None:
    if user is None:
        return None
    try:
        return await runs.elsewhere(run_id, user)
    except (DomainError, SandboxError):
        return None


async def _replayed(websocket: WebSocket, runs: ProjectRuns, run_id: str, user: User | None) -> bool:
    """A run that is over and no longer live anywhere ends its socket as a followed run does: its stored output
    (stdout, then stderr) and its exit frame. A quick run started on another `serve --workers` worker or replica
    is often over before the browser's socket opens: that used to close 4404 and the console said its output
    stopped."""
    if user is None:
        return False

    def stored() -> RunPublic | None:
        with websocket.app.state.sessionmaker() as db:
            try:
                run = runs.get(db, run_id, user)
            except (DomainError, SandboxError):
                return None
        return run if run.status == "finished" else None

    run = await run_in_threadpool(stored)
    if run is None:
        return False
    with suppress(*SOCKET_GONE):
        for stream, text in (("stdout", run.stdout), ("stderr", run.stderr)):
            if text:
                await websocket.send_json({"type": stream, "data": text})
        await _send_exit(websocket, run)
    return True


async def _send_exit(websocket: WebSocket, run: RunPublic) -> None:
    """The last frame of a run's socket (its output went before, as frames of their own), then a normal close."""
    await websocket.send_json({**run.model_dump(mode="json", exclude={"stdout", "stderr"}), "type": "exit"})
    await websocket.close(1000)


async def _read_stdin(websocket: WebSocket, queue: RunQueue, run_id: str, can_write: bool) -> None:
    while True:
        try:
            frame = await receive_frame(websocket)
            if not can_write:
                raise ValueError("only editors of the project can type into a run")
            if frame["type"] == "stdin" and isinstance(frame.get("data"), str):
                await queue.send_stdin(run_id, frame["data"].encode())
            elif frame["type"] == "stdin_eof":
                await queue.close_stdin(run_id)
            else:
                raise ValueError('frames are {"type": "stdin", "data": ...} or {"type": "stdin_eof"}')
        except ValueError as exc:
            await websocket.send_json({"type": "error", "message": str(exc)})


async def _stream_run(websocket: WebSocket, runs: ProjectRuns, run_id: str, user: User, can_write: bool,
                      check_access: Callable[[], None]) -> None:
    """Replay and follow the run's output, pass input on, and end with its exit frame (or 4403 when a
    membership change takes away the access the socket was opened with)."""
    queue = runs.queue
    assert queue is not None  # runs.check found the run live
    record = queue.get(run_id)
    followed = False

    async def follow() -> None:
        async with anyio.create_task_group() as tasks:
            async def pump() -> None:
                nonlocal followed
                with suppress(*SOCKET_GONE):
                    await send_chunks(websocket, runs.updates_for(record, user))
                    followed = True
                tasks.cancel_scope.cancel()

            async def read() -> None:
                with suppress(*SOCKET_GONE):
                    await _read_stdin(websocket, queue, run_id, can_write)
                tasks.cancel_scope.cancel()  # the client left; the run goes on

            tasks.start_soon(pump)
            tasks.start_soon(read)

    with runs.holding(record.project_id, user.id, check_access) as revoked:
        if await _until_revoked(revoked, follow):
            await _close_revoked(websocket)
            return
    if not followed:
        return
    with suppress(*SOCKET_GONE):
        await _send_exit(websocket, public_of_record(record))


@router.websocket("/ws/projects/{project_id}/shell")
async def shell_socket(websocket: WebSocket, project_id: str, rows: int = Query(24, ge=1, le=1000),
                       cols: int = Query(80, ge=1, le=1000)) -> None:
    """A bash shell on a terminal in the project's sandbox (editors): frames {"type": "input"|"resize"}."""
    await websocket.accept()
    runs = runs_of(websocket)
    try:
        user = await run_in_threadpool(_caller, websocket)

        def authorize() -> None:
            with websocket.app.state.sessionmaker() as db:
                projects.authorize(db, project_id, user, Role.editor, public_read=False)

        await run_in_threadpool(authorize)
        backend = runs.require_backend()
        runs.claim_shell(user)
    except (DomainError, SandboxError) as exc:
        await _close_denied(websocket, exc)
        return

    try:
        await runs.editors.flush(project_id)
        packages = await runs.shell_packages(project_id)

        async def shell() -> None:
            await serve_shell(websocket, backend, runs.project_dir(project_id), rows, cols, packages.env,
                              packages.mounts, on_files=lambda: runs.files_changed(project_id))

        with runs.holding(project_id, user.id, authorize) as revoked:
            if await _until_revoked(revoked, shell):  # the shell, and all it started, ended with the cancel
                await _close_revoked(websocket)
    finally:
        runs.release_shell(user)
        runs.files_changed(project_id)


def _run_environment(sessions: sessionmaker[Session], secrets: RunSecrets | None) -> Callable[[str], dict[str, str]]:
    """A run's extra environment: the secrets its project's owner exposes to runs (none without secrets)."""

    def environment(project_id: str) -> dict[str, str]:
        if secrets is None:
            return {}
        with sessions() as db:
            return secrets.run_environment_for(db, project_id)

    return environment


@asynccontextmanager
async def open_runs(core: Core, *, events: ProjectEvents | None, collab: Collab | None,
                    secrets: RunSecrets | None) -> AsyncIterator[ProjectRuns]:
    """Pick the backend (or remember why there is none), clear what a crash left, start the queue."""
    settings = core.settings
    try:
        backend, unavailable = make_backend(settings.sandbox_backend, pool_size=settings.sandbox_warm_containers,
                                             redis_url=settings.redis_url), ""
    except SandboxUnavailable as exc:
        backend, unavailable = None, exc.detail
        log.warning("code runs are off: %s", exc.detail)
    warming = getattr(backend, "warm_up", None)
    warm_up = asyncio.create_task(warming()) if warming is not None and settings.sandbox_warm_containers else None
    lease = HostLease()
    if backend is not None and backend.name != "runners" and lease.alone():  # a crash's leftovers, not another server's runs
        client = docker_client(timeout=10) if backend.name == "docker" else None
        removed = await run_in_threadpool(sweep, client)
        if removed:
            log.warning("removed %d leftovers of earlier runs", len(removed))
    if backend is not None and backend.name == "runners":
        installer = runners_installer(backend, settings.effective_packages_dir)
    else:
        installer = bubblewrap_installer(settings.effective_packages_dir) if backend is not None else None
    presence = server_presence(settings.redis_url, f"{settings.reachable_host}:{settings.port}")
    await presence.start()
    runs = ProjectRuns(backend, unavailable, sessions=core.sessions, projects_dir=settings.projects_dir,
                       editors=OpenEditors.of(collab),
                       announce=events.announce if events else None,
                       environment_of=_run_environment(core.sessions, secrets),
                       installer=installer, max_running=settings.sandbox_max_running,
                       max_running_per_user=settings.sandbox_max_running_per_user,
                       max_per_user=settings.sandbox_max_runs_per_user, server_id=presence.server_id,
                       preview_tag=settings.worker_tag,
                       address_of=presence.address_of if isinstance(presence, SharedPresence) else None)
    orphans = OrphanedRuns(presence, runs.unfinished_servers, runs.close_runs_of,
                           confirm=presence.shared and not settings.redis_private)
    await orphans.sweep_logged()
    sweeping = asyncio.create_task(orphans.sweep_forever()) if presence.shared else None
    if events is not None:
        events.on_access_changed(runs.access_changed)  # a removed member's Webviews close at once
    own_runner = await start_own_runner(settings) if backend is not None and backend.name == "runners" else None
    try:
        yield runs
    finally:
        if sweeping is not None:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
        if own_runner is not None:
            await own_runner()
        await runs.shutdown()
        await presence.close()
        close = getattr(backend, "close", None)
        if close is not None:
            await close()
        if warm_up is not None:
            await asyncio.gather(warm_up, return_exceptions=True)
        lease.close()


def _setup(app: FastAPI) -> None:
    answer_like_domain_errors(app, SandboxError)


component = Component(name="sandbox", router=router, setup=_setup, builds=Builders(runs=open_runs))
