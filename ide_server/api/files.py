"""Project files: /api/projects/{project_id}/files/... (thin handlers over services.files)."""

import mimetypes
import tempfile
from pathlib import Path
from typing import IO, Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ide_server.components import Component
from ide_server.deps import ProjectEditor, ProjectViewer, SettingsDep
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.errors import InvalidInput, TooLarge
from ide_server.events import EventsDep, ProjectEvents
from ide_server.schemas import FileCreate, FileEntry, FileMove, SearchMatch, SearchResults, UploadResult
from ide_server.services import files, projects, search
from ide_server.services.projects import ProjectAccess
from ide_server.settings import Settings

router = APIRouter(prefix="/api/projects/{project_id}/files", tags=["files"], responses=ERROR_RESPONSES)

RAW_BODY = {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
ZIP_BODY = {"required": True, "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}
# File content is user-controlled: never let a browser run it in the IDE's origin.
RAW_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox; default-src 'none'"}


def _root(settings: Settings, ctx: ProjectAccess) -> Path:
    return projects.project_dir(settings.projects_dir, ctx.project.id)


def _publish(events: ProjectEvents | None, ctx: ProjectAccess, action: str, path: str, to: str | None = None) -> None:
    """Tell open workspaces the tree changed (no-op when the events component is not loaded)."""
    if events is not None:
        events.files_changed(ctx.project.id, action, path, to)


async def _body_to_file(request: Request, limit: int) -> IO[bytes]:
    """Stream the request body into a temporary file, refusing it as soon as it passes `limit`."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the upload is larger than {limit} bytes")
    out = tempfile.SpooledTemporaryFile(max_size=files.CHUNK * 8)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                out.close()
                raise TooLarge(f"the upload is larger than {limit} bytes")
            out.write(chunk)
    except ClientDisconnect:  # the client gave up mid-upload (a timeout): nothing was written
        out.close()
        raise InvalidInput("the upload was cut off before its end; nothing was saved") from None
    out.seek(0)
    return out


@router.get("")
def file_tree(ctx: ProjectViewer, settings: SettingsDep) -> list[FileEntry]:
    """Every file and folder of the project, sorted by path (symlinks listed, not followed)."""
    return [FileEntry.model_validate(e) for e in files.tree(_root(settings, ctx))]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_entry(body: FileCreate, ctx: ProjectEditor, settings: SettingsDep, events: EventsDep) -> FileEntry:
    """Create a new file (with optional text) or folder; 409 if the path exists."""
    root = _root(settings, ctx)
    if body.kind == "directory":
        entry = files.make_dir(root, body.path)
    else:
        entry = files.write(root, body.path, body.content.encode(), settings.max_file_bytes, create_only=True)
    _publish(events, ctx, "create", body.path)
    return FileEntry.model_validate(entry)


@router.get(
    "/content/{path:path}",
    response_class=Response,
    responses={200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}}},
)
def read_file(path: str, ctx: ProjectViewer, settings: SettingsDep, download: bool = False) -> Response:
    """The file's raw bytes, with a content type guessed from its name; `download=true` saves it as a file."""
    data = files.read(_root(settings, ctx), path, settings.max_file_bytes)
    media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    saved = {"Content-Disposition": f"attachment; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}"} if download else {}
    return Response(data, media_type=media_type, headers={**RAW_HEADERS, **saved})


@router.get("/search")
def search_files(ctx: ProjectViewer, settings: SettingsDep, q: Annotated[str, Query(min_length=1, max_length=200)],
                 case_sensitive: bool = False) -> SearchResults:
    """Lines of the project's text files that contain `q` (generated folders, binary and large files skipped)."""
    found, truncated = search.search(_root(settings, ctx), q, case_sensitive)
    return SearchResults(matches=[SearchMatch.model_validate(m) for m in found], truncated=truncated)


@router.put("/content/{path:path}", openapi_extra={"requestBody": RAW_BODY})
async def write_file(
    path: str, request: Request, ctx: ProjectEditor, settings: SettingsDep, events: EventsDep
) -> FileEntry:
    """Create or replace a file with the request body's bytes (parent folders are created)."""
    body = await _body_to_file(request, settings.max_file_bytes)
    with body:
        data = body.read()
    entry = await run_in_threadpool(files.write, _root(settings, ctx), path, data, settings.max_file_bytes)
    _publish(events, ctx, "write", path)
    return FileEntry.model_validate(entry)


@router.delete("/content/{path:path}", status_code=status.HTTP_204_NO_CONTENT)
def delete_entry(path: str, ctx: ProjectEditor, settings: SettingsDep, events: EventsDep) -> None:
    """Delete a file or a folder with everything in it."""
    files.delete(_root(settings, ctx), path)
    _publish(events, ctx, "delete", path)


@router.post("/move")
def move_entry(body: FileMove, ctx: ProjectEditor, settings: SettingsDep, events: EventsDep) -> FileEntry:
    """Rename or move a file or folder; 409 if the destination exists."""
    entry = files.move(_root(settings, ctx), body.src, body.dst)
    _publish(events, ctx, "move", body.src, body.dst)
    return FileEntry.model_validate(entry)


@router.get(
    "/zip",
    response_class=StreamingResponse,
    responses={200: {"description": "The project as a zip", "content": {"application/zip": {}}}},
)
def download_zip(ctx: ProjectViewer, settings: SettingsDep) -> StreamingResponse:
    archive = files.zip_project(_root(settings, ctx))
    filename = f"{ctx.project.id}.zip"
    return StreamingResponse(
        files.iter_file(archive),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.post("/zip", openapi_extra={"requestBody": ZIP_BODY})
async def upload_zip(request: Request, ctx: ProjectEditor, settings: SettingsDep, events: EventsDep) -> UploadResult:
    """Extract a zip (the request body) into the project, overwriting files with the same path."""
    archive = await _body_to_file(request, settings.max_upload_bytes)
    with archive:
        count = await run_in_threadpool(
            files.unzip_into,
            _root(settings, ctx),
            archive,
            max_total=settings.max_upload_bytes,
            max_files=settings.max_upload_files,
            max_file=settings.max_file_bytes,
        )
    _publish(events, ctx, "upload", "")
    return UploadResult(files_written=count)


component = Component(name="files", router=router)
