"""Deploys as an ide_server component: the deployments API, the logs WebSocket, the apps' proxy, the lifespan.

Handlers are thin; DeployService (over rules.py, rollout.py, supervisor.py) does the work. Editors
deploy, roll back, scale, stop and read the logs (an app may print its secrets); the owner deletes;
members read the status; everyone reaches the app at /apps/{slug}/.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, FastAPI, Response, WebSocket, status
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from collab.editors import OpenEditors
from deploy_service.edge import AppsEdge
from deploy_service.owner import Ownership, this_replica
from deploy_service.preview import PreviewGateway
from deploy_service.proxy import AppsGateway
from deploy_service.rules import DeploymentNotFound
from deploy_service.schemas import DeploymentPublic, RollbackCreate, ScaleUpdate
from deploy_service.secrets import ProjectSecrets
from deploy_service.service import DeployService
from ide_server.components import Component
from ide_server.deps import ProjectEditor, ProjectMember, ProjectOwner, authenticate_websocket
from ide_server.error_handlers import ERROR_RESPONSES, answer_like_domain_errors
from ide_server.errors import DomainError, NotAuthenticated
from ide_server.leases import connect
from ide_server.models import Role
from ide_server.services import projects
from ide_server.wiring import Builders, Collab, Core, DeployParts, required, services_of
from sandbox import (
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    SOCKET_GONE,
    ProjectRuns,
    RunnerHosting,
    SandboxError,
    SandboxUnavailable,
    bubblewrap_installer,
    make_backend,
    remove_stale_cgroups,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["deployments"], responses={**ERROR_RESPONSES, 503: {"description": "No sandbox on this server"}})


def deploys_of(conn: HTTPConnection) -> DeployService:
    return required(services_of(conn.app.state).deploys, "deploys")


async def _deploys(conn: HTTPConnection) -> DeployService:
    """Async, as every dependency without I/O: a sync one costs a worker-thread hop per request."""
    return deploys_of(conn)


Deploys = Annotated[DeployService, Depends(_deploys)]


@router.post("/api/projects/{project_id}/deployments", status_code=status.HTTP_202_ACCEPTED)
async def deploy(ctx: ProjectEditor, deploys: Deploys) -> DeploymentPublic:
    """Deploy the project as it is now (a fresh checkpoint); the new release goes live once healthy."""
    assert ctx.user is not None  # an editor is signed in
    return await deploys.deploy(ctx.user, ctx.project.id)


@router.get("/api/projects/{project_id}/deployment")
def get_deployment(ctx: ProjectMember, deploys: Deploys) -> DeploymentPublic | None:
    """Status, URL, instances and releases (newest first) of the project's deployment; null when it has none
    (most projects: every workspace asks, and "none" is no error)."""
    try:
        return deploys.status(ctx.project.id)
    except DeploymentNotFound:
        return None


@router.post("/api/projects/{project_id}/deployment/rollback", status_code=status.HTTP_202_ACCEPTED)
async def rollback(body: RollbackCreate, ctx: ProjectEditor, deploys: Deploys) -> DeploymentPublic:
    """Serve an earlier successful release again (once its instances are healthy)."""
    return await deploys.rollback(ctx.project.id, body.release_id)


@router.post("/api/projects/{project_id}/deployment/scale")
async def scale(body: ScaleUpdate, ctx: ProjectEditor, deploys: Deploys) -> DeploymentPublic:
    """Run this many instances of the current release (requests go round-robin)."""
    return await deploys.scale(ctx.project.id, body.instances)


@router.post("/api/projects/{project_id}/deployment/stop")
async def stop(ctx: ProjectEditor, deploys: Deploys) -> DeploymentPublic:
    """Stop serving the app (requests in flight finish); deploy again to start it."""
    return await deploys.stop(ctx.project.id)


@router.delete("/api/projects/{project_id}/deployment", status_code=status.HTTP_204_NO_CONTENT)
async def delete(ctx: ProjectOwner, deploys: Deploys) -> Response:
    """Stop the app and delete the deployment with its releases and logs."""
    await deploys.delete(ctx.project.id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.websocket("/ws/projects/{project_id}/deployment/logs")
async def logs_socket(websocket: WebSocket, project_id: str) -> None:
    """Build and runtime log frames {"type": "log", "release", "stream", "data", "time"}: the kept tail, then live."""
    await websocket.accept()
    deploys = deploys_of(websocket)

    def authorize() -> None:
        with websocket.app.state.sessionmaker() as db:
            user = authenticate_websocket(websocket, db, websocket.app.state.settings)
            if user is None:
                raise NotAuthenticated("sign in first")
            projects.authorize(db, project_id, user, Role.editor, public_read=False)  # an app may print its secrets

    try:
        await run_in_threadpool(authorize)
        deploy_log = await run_in_threadpool(deploys.log_of, project_id)
    except DomainError as exc:
        code = {401: CLOSE_UNAUTHENTICATED, 403: CLOSE_FORBIDDEN}.get(exc.status_code, CLOSE_NOT_FOUND)
        await websocket.close(code, exc.detail[:120])
        return
    async with anyio.create_task_group() as tasks:
        async def pump() -> None:
            with suppress(*SOCKET_GONE):
                async for entry in deploy_log.follow(from_file=not deploys.ownership.is_owner):
                    await websocket.send_json(entry)
            tasks.cancel_scope.cancel()

        async def watch() -> None:
            """The client sends nothing; receiving is how a closed tab (or a server shutting down) ends the
            follow, which otherwise waits for the next log entry forever and holds up the server's exit."""
            with suppress(*SOCKET_GONE):
                while (await websocket.receive())["type"] != "websocket.disconnect":
                    pass
            tasks.cancel_scope.cancel()

        tasks.start_soon(pump)
        tasks.start_soon(watch)


def deploy_setup(app: FastAPI) -> None:
    app.add_middleware(AppsGateway)  # everyone reaches the apps at /apps/{slug}/; the app decides what it serves
    app.add_middleware(PreviewGateway)  # runs' Webviews at /preview/{token}/, for those who know the run's token
    answer_like_domain_errors(app, SandboxError)  # deploys raise them too (no backend, no free app uid)


@asynccontextmanager
async def open_deploys(core: Core, *, runs: ProjectRuns | None, collab: Collab | None,
                       secrets: ProjectSecrets | None) -> AsyncIterator[DeployParts]:
    """A sandbox backend for the apps (or the reason there is none), then bring back what was deployed."""
    settings = core.settings
    hosting: RunnerHosting | None = None
    if settings.sandbox_backend == "runners" and runs is not None and runs.backend is not None and settings.redis_url:
        # Runner nodes: builds are runs like any other, instances are placed on runners by their free capacity
        backend, unavailable, hosting = runs.backend, "", RunnerHosting(connect(settings.redis_url))
    else:
        try:  # the runs' choice (auto: Docker where an engine answers with the runner image, else bubblewrap)
            backend, unavailable = make_backend(settings.sandbox_backend), ""
        except SandboxUnavailable as exc:
            backend, unavailable = None, f"deploys are off: {exc.detail}"
            log.warning(unavailable)
    installer = runs.installer if runs is not None else None  # the runs' package cache, shared
    if installer is None and backend is not None:
        installer = bubblewrap_installer(settings.effective_packages_dir)
    deploys = DeployService(
        sessions=core.sessions, projects_dir=settings.projects_dir, root=settings.data_dir / "deploy",
        backend=backend, unavailable=unavailable, installer=installer, editors=OpenEditors.of(collab),
        secrets_of=secrets.environment_for if secrets is not None else None,
        apps_host=settings.deploy_apps_host, https=settings.secure_cookies, hosting=hosting)
    if backend is not None and hosting is None and (stale := await run_in_threadpool(remove_stale_cgroups)):
        log.warning("removed %d cgroups of app instances a previous server left", len(stale))
    edge = None
    if settings.deploy_apps_port is not None:
        edge = AppsEdge(deploys)
        await edge.start(settings.host, settings.deploy_apps_port, shared=bool(settings.worker_addresses))
        log.info("apps also on port %d", edge.port)
    deploys.ownership = ownership = Ownership(
        this_replica(settings.reachable_host, settings.port, edge.port if edge else None), settings.redis_url,
        can_own=backend is not None)
    keeping = None
    if ownership.redis is not None:  # replicas: the lease holder runs the apps
        keeping = asyncio.create_task(ownership.keep(gained=lambda: _bring_back(deploys), lost=deploys.shutdown))
    else:
        await _bring_back(deploys)
    try:
        yield DeployParts(deploys, edge)
    finally:
        if keeping is not None:
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)
        if edge is not None:
            await edge.close()
        await deploys.shutdown()
        await ownership.close()
        if hosting is not None:
            await hosting.close()
            await hosting.redis.aclose()
        elif (close := getattr(backend, "close", None)) is not None:  # (the runs' backend is theirs to close)
            await close()


async def _bring_back(deploys: DeployService) -> None:
    if deploys.backend is not None and (restored := await deploys.restore()):
        log.info("bringing back %d deployments", restored)


component = Component(name="deploys", router=router, setup=deploy_setup, builds=Builders(deploys=open_deploys))
