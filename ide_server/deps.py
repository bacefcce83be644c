"""Typed request dependencies shared by every component: DB session, identity, project access.

They take an `HTTPConnection`, so the same dependencies guard HTTP routes and WebSocket routes
(a DomainError raised while opening a WebSocket becomes an HTTP denial response: 401/403/404).

Use them as annotations:

    @router.post("/projects/{project_id}/thing")
    def make_thing(ctx: ProjectEditor, db: DbSession) -> ThingPublic: ...

Each access dependency carries an `access_rule` (see `access.py`); a route under /api (or in the
OpenAPI document) must use at least one of `Public`, `CurrentUser`, `ProjectViewer`,
`ProjectMember`, `ProjectEditor`, `ProjectOwner`, or the app refuses to start.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from ide_server import access, security
from ide_server.errors import NotAuthenticated, PermissionDenied
from ide_server.models import Project, Role, User
from ide_server.schemas import RandomId
from ide_server.services import accounts, projects
from ide_server.settings import Settings

SESSION_COOKIE = "codeyard_session"
CSRF_COOKIE = "codeyard_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# These two are async (they do no I/O but closing a session that holds a connection): FastAPI runs a
# sync dependency in a worker thread, and under a class's load every such hop waited its turn on
# the event loop, several times per request.
async def get_settings(conn: HTTPConnection) -> Settings:
    settings: Settings = conn.app.state.settings
    return settings


async def get_db(conn: HTTPConnection) -> AsyncIterator[Session]:
    db = conn.app.state.sessionmaker()
    try:
        yield db
    finally:
        if db.in_transaction():  # a connection to give back (a rollback): blocking, so in a thread
            await run_in_threadpool(db.close)
        else:
            db.close()


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbSession = Annotated[Session, Depends(get_db)]


@dataclass(frozen=True)
class Identity:
    """Who is calling and how: via "cookie", "token", or neither (anonymous)."""

    user: User | None
    via: str | None = None


def identify(conn: HTTPConnection, db: Session, settings: Settings) -> Identity:
    """Resolve the caller from a Bearer token or the session cookie.

    A Bearer header that is wrong is an error (never a silent fall back to anonymous). Cookie
    requests with unsafe methods must echo the session's CSRF token in the X-CSRF-Token header;
    cookie WebSocket handshakes must come from this site (Origin host = Host), which stops
    cross-site WebSocket hijacking.
    """
    auth = conn.headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        user = accounts.user_for_api_token(db, token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise NotAuthenticated("invalid or revoked API token")
        return Identity(user, "token")
    session_token = conn.cookies.get(SESSION_COOKIE)
    if not session_token:
        return Identity(None)
    user = accounts.user_for_session(db, session_token)
    if user is None:
        return Identity(None)
    if conn.scope["type"] == "websocket":
        origin = conn.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != conn.headers.get("host"):
            raise PermissionDenied("cross-site WebSocket refused")
    elif conn.scope.get("method", "GET") not in SAFE_METHODS:
        if not security.csrf_ok(settings.secret, session_token, conn.headers.get(CSRF_HEADER)):
            raise PermissionDenied(f"missing or wrong {CSRF_HEADER} header (read it from the {CSRF_COOKIE} cookie)")
    return Identity(user, "cookie")


def _release(db: Session) -> None:
    """End the access check's read transaction, so its pooled connection goes back at once.

    A request keeps its dependencies' session until it ends: across every await of an async route
    (a run's checkpoint, a file upload) and a WebSocket's whole life. Holding a connection there
    starved the pool under load; a sync route's own queries simply take one again."""
    db.commit()


# The request's Identity once resolved, so the access check that follows reuses it.
IDENTITY_KEY = "codeyard.identity"


def _identified(conn: HTTPConnection, db: Session, settings: Settings) -> Identity:
    identity = conn.scope.get(IDENTITY_KEY)
    if identity is None:
        identity = conn.scope[IDENTITY_KEY] = identify(conn, db, settings)
    return identity


def _identify_and_release(conn: HTTPConnection, db: Session, settings: Settings) -> Identity:
    identity = _identified(conn, db, settings)
    _release(db)
    return identity


async def _identity(conn: HTTPConnection, db: DbSession, settings: SettingsDep) -> Identity:
    """Resolved once per request; the query runs in a worker thread."""
    identity: Identity | None = conn.scope.get(IDENTITY_KEY)
    if identity is not None:
        return identity
    return await run_in_threadpool(_identify_and_release, conn, db, settings)


IdentityDep = Annotated[Identity, Depends(_identity)]


async def optional_user(identity: IdentityDep) -> User | None:
    return identity.user


async def require_user(identity: IdentityDep) -> User:
    if identity.user is None:
        raise NotAuthenticated("sign in first")
    return identity.user


async def anyone() -> None:
    """Marks a route as open to everyone, anonymous included."""


require_user.access_rule = access.SIGNED_IN  # type: ignore[attr-defined]
anyone.access_rule = access.PUBLIC  # type: ignore[attr-defined]

OptionalUser = Annotated[User | None, Depends(optional_user)]
CurrentUser = Annotated[User, Depends(require_user)]
Public = Depends(anyone)  # use as `dependencies=[Public]`


class _ProjectAccess:
    """Dependency: the `{project_id}` in the path, if the caller holds at least `min_role`."""

    def __init__(self, min_role: Role, public_read: bool):
        self.min_role = min_role
        self.public_read = public_read
        self.access_rule = access.project_rule(min_role, public_read)

    async def __call__(
        self, project_id: RandomId, conn: HTTPConnection, db: DbSession, settings: SettingsDep
    ) -> projects.ProjectAccess:
        """Who is asking and what they may do here: one worker-thread hop and one read transaction
        for both (each hop waits its turn on the event loop; under a class's load that was most of
        a small request's time)."""
        return await run_in_threadpool(self._check, project_id, conn, db, settings)

    def _check(self, project_id: str, conn: HTTPConnection, db: Session, settings: Settings) -> projects.ProjectAccess:
        identity = _identified(conn, db, settings)
        access = projects.authorize(db, project_id, identity.user, self.min_role, self.public_read)
        _release(db)
        return access


@cache
def project_access(min_role: Role, public_read: bool = False) -> _ProjectAccess:
    """One shared instance per rule, so FastAPI caches it per request like any dependency."""
    return _ProjectAccess(min_role, public_read)


# Read routes: members, plus anyone (anonymous included) when the project is public.
ProjectViewer = Annotated[projects.ProjectAccess, Depends(project_access(Role.viewer, public_read=True))]
# Members only, even on public projects.
ProjectMember = Annotated[projects.ProjectAccess, Depends(project_access(Role.viewer))]
ProjectEditor = Annotated[projects.ProjectAccess, Depends(project_access(Role.editor))]
ProjectOwner = Annotated[projects.ProjectAccess, Depends(project_access(Role.owner))]


def authenticate_websocket(websocket: WebSocket, db: Session, settings: Settings) -> User | None:
    """The user behind a WebSocket handshake (Bearer header or session cookie), or None if anonymous.

    For WebSocket routes that check access themselves instead of using the dependencies above.
    Raises NotAuthenticated for a bad token, PermissionDenied for a cross-site cookie handshake.
    """
    return identify(websocket, db, settings).user


def project_role(db: Session, project: Project | str, user: User | None) -> Role | None:
    """The user's role on a project (None: not a member, or anonymous)."""
    return projects.role_of(db, project if isinstance(project, str) else project.id, user)
