"""History over HTTP: /api/projects/{project_id}/history (list, read, diff, checkpoint, name, restore).

Thin handlers over collab.history. The collab component keeps one ProjectHistory per project on
the app (its git operations are serialised per instance). Restores go through the rooms, so
everyone with the file open sees the old text arrive live; the project events channel is told so
file trees refresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, ParamSpec, TypeVar

from fastapi import APIRouter, Depends, Query, status
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.requests import HTTPConnection, Request

from collab.api.editing import histories_of, rooms_of
from collab.history import Author, Checkpoint, Histories, NameTaken, restore_file, restore_project, user_author
from collab.room import RoomKey
from ide_server import paths
from ide_server.components import Component
from ide_server.deps import ProjectEditor, ProjectViewer
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.errors import Conflict, InvalidInput, NotFound
from ide_server.events import EventsDep
from ide_server.services.projects import ProjectAccess

P = ParamSpec("P")
R = TypeVar("R")
router = APIRouter(prefix="/api/projects/{project_id}/history", tags=["history"], responses=ERROR_RESPONSES)

Version = Annotated[str, Query(min_length=4, max_length=64)]


class AuthorPublic(BaseModel):
    name: str
    email: str


class CheckpointPublic(BaseModel):
    version: str
    message: str
    authors: list[AuthorPublic]
    created_at: datetime
    names: list[str]


class CheckpointCreate(BaseModel):
    message: str = Field(default="Checkpoint", min_length=1, max_length=200)
    name: str | None = Field(default=None, min_length=1, max_length=64)


class CheckpointName(BaseModel):
    name: str = Field(min_length=1, max_length=64)


class RestoreRequest(BaseModel):
    """path: restore only this file; leave it out to restore the whole project."""

    version: str = Field(min_length=4, max_length=64)
    path: str | None = Field(default=None, max_length=1000)


class DiffPublic(BaseModel):
    old: str
    new: str
    path: str | None
    diff: str


async def _histories(conn: HTTPConnection) -> Histories:
    return histories_of(conn.app)


HistoriesDep = Annotated[Histories, Depends(_histories)]


def _public(checkpoint: Checkpoint) -> CheckpointPublic:
    return CheckpointPublic(
        version=checkpoint.version,
        message=checkpoint.message,
        authors=[AuthorPublic(name=a.name, email=a.email) for a in checkpoint.authors],
        created_at=checkpoint.created_at,
        names=list(checkpoint.names),
    )


async def _call(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a blocking history call in a thread; its ValueError (a bad version or name) becomes a 400."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except NameTaken as exc:
        raise Conflict(str(exc)) from exc
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    except FileNotFoundError as exc:
        raise NotFound(str(exc)) from exc


def _author(ctx: ProjectAccess) -> Author:
    return user_author(ctx.user.username if ctx.user is not None else "guest")


@router.get("")
async def list_checkpoints(
    ctx: ProjectViewer, histories: HistoriesDep, path: Annotated[str | None, Query(max_length=1000)] = None
) -> list[CheckpointPublic]:
    """Checkpoints, newest first; with path, only those that changed that file."""
    clean = paths.normalise(path) if path else None
    return [_public(c) for c in await _call(histories.of(ctx.project.id).list, clean)]


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_checkpoint(
    body: CheckpointCreate, ctx: ProjectEditor, histories: HistoriesDep, conn: Request
) -> CheckpointPublic | None:
    """Commit the project as it is now (open editors flushed first); null when nothing changed."""
    await rooms_of(conn.app).flush_project(ctx.project.id)
    history = histories.of(ctx.project.id)
    checkpoint = await _call(history.checkpoint, body.message, [_author(ctx)], body.name)
    return _public(checkpoint) if checkpoint else None


@router.get("/diff")
async def diff(
    ctx: ProjectViewer,
    histories: HistoriesDep,
    old: Version,
    new: Version,
    path: Annotated[str | None, Query(max_length=1000)] = None,
) -> DiffPublic:
    """Unified diff between two checkpoints (of one file, or the whole project)."""
    clean = paths.normalise(path) if path else None
    text = await _call(histories.of(ctx.project.id).diff, old, new, clean)
    return DiffPublic(old=old, new=new, path=clean, diff=text)


@router.get(
    "/{version}/files/{path:path}",
    response_class=Response,
    responses={200: {"description": "The file's text at that checkpoint", "content": {"text/plain": {}}}},
)
async def read_at_version(version: str, path: str, ctx: ProjectViewer, histories: HistoriesDep) -> PlainTextResponse:
    """A file's text as it was at a checkpoint."""
    data = await _call(histories.of(ctx.project.id).read, version, paths.normalise(path))
    return PlainTextResponse(data.decode("utf-8", errors="replace"))


@router.post("/{version}/name")
async def name_checkpoint(version: str, body: CheckpointName, ctx: ProjectEditor, histories: HistoriesDep) -> CheckpointPublic:
    """Give a checkpoint a name (e.g. "before-refactor") to find it again."""
    return _public(await _call(histories.of(ctx.project.id).name, version, body.name))


@router.post("/restore")
async def restore(
    body: RestoreRequest, ctx: ProjectEditor, histories: HistoriesDep, conn: Request, events: EventsDep
) -> None:
    """Put a file (or every file) back as it was at a checkpoint, as a live edit everyone sees."""
    history = histories.of(ctx.project.id)
    rooms = rooms_of(conn.app)
    try:
        if body.path:
            await restore_file(history, rooms, RoomKey(ctx.project.id, paths.normalise(body.path)), body.version)
        else:
            await restore_project(history, rooms, ctx.project.id, body.version)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    except FileNotFoundError as exc:
        raise NotFound(str(exc)) from exc
    if events is not None:
        events.files_changed(ctx.project.id, "restore", body.path or "", None)


component = Component(name="history", router=router, needs=("collab",))
