"""Browser pages: Jinja2 shells that load the Vite bundle, and the hashed static assets.

HTML is never cached (so a deploy shows new code at once); hashed assets are cached forever.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.types import Scope

from ide_server.deps import OptionalUser

ASSETS_DIR = Path(__file__).parent / "webassets"
STATIC_PREFIX = "/static/"
ENTRY = "src/main.ts"

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class EntryAssets:
    """The script and stylesheets a page shell must load, with their hashed names."""

    js: str | None = None
    css: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def entry_assets() -> EntryAssets:
    manifest_path = ASSETS_DIR / "manifest.json"
    if not manifest_path.is_file():
        return EntryAssets()
    entry = json.loads(manifest_path.read_text())[ENTRY]
    return EntryAssets(
        js=STATIC_PREFIX + entry["file"],
        css=[STATIC_PREFIX + name for name in entry.get("css", [])],
    )


class HashedStaticFiles(StaticFiles):
    """Static files whose hashed names under assets/ may be cached for a year."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if path.startswith("assets/") and response.status_code == 200:
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        else:
            response.headers["Cache-Control"] = "no-cache"
        return response


def render_page(request: Request, page: str, title: str, param: str = "") -> HTMLResponse:
    """The shell names the page (and its one parameter) for the front end's router."""
    response = templates.TemplateResponse(
        request, "page.html", {"page": page, "title": title, "param": param, "assets": entry_assets()}
    )
    response.headers["Cache-Control"] = "no-cache"
    return response


@router.get("/", response_model=None)
def home(request: Request, user: OptionalUser) -> Response:
    """Signed-in users go on to their projects; a visitor reads what Codeyard is, with the way in."""
    if user is not None:
        return RedirectResponse("/dashboard", status_code=303)
    return render_page(request, "landing", "Write, run and share code together")


@router.get("/login")
def login_page(request: Request) -> HTMLResponse:
    return render_page(request, "login", "Sign in")


@router.get("/register")
def register_page(request: Request) -> HTMLResponse:
    return render_page(request, "register", "Create account")


@router.get("/dashboard")
def dashboard_page(request: Request) -> HTMLResponse:
    return render_page(request, "dashboard", "Dashboard")


@router.get("/settings")
def settings_page(request: Request) -> HTMLResponse:
    return render_page(request, "settings", "Settings")


@router.get("/projects/{project_id}")
def project_page(request: Request, project_id: str) -> HTMLResponse:
    return render_page(request, "project", "Project", project_id)


@router.get("/invite/{token}")
def invite_page(request: Request, token: str) -> HTMLResponse:
    return render_page(request, "invite", "Invitation", token)


@router.get("/courses")
def courses_page(request: Request) -> HTMLResponse:
    return render_page(request, "courses", "Courses")


@router.get("/courses/{slug}")
def course_page(request: Request, slug: str) -> HTMLResponse:
    return render_page(request, "course", "Course", slug)


@router.get("/classrooms")
def classrooms_page(request: Request) -> HTMLResponse:
    return render_page(request, "classrooms", "Classrooms")


@router.get("/classrooms/{classroom_id}")
def classroom_page(request: Request, classroom_id: str) -> HTMLResponse:
    return render_page(request, "classroom", "Classroom", classroom_id)


def mount_web(app: FastAPI) -> None:
    """Adds the page routes and the static asset mount to the app."""
    app.include_router(router)
    app.mount(STATIC_PREFIX.rstrip("/"), HashedStaticFiles(directory=ASSETS_DIR, check_dir=False), name="static")
