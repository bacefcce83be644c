"""Accounts: register, sign in and out, the current user, personal API tokens."""

from fastapi import APIRouter, Request, Response, status

from ide_server import security
from ide_server.components import Component
from ide_server.deps import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    CurrentUser,
    DbSession,
    Public,
    SettingsDep,
)
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.models import User
from ide_server.schemas import (
    LoginPublic,
    LoginRequest,
    PasswordChange,
    RandomId,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserCreate,
    UserPublic,
)
from ide_server.services import accounts
from ide_server.settings import Settings

router = APIRouter(prefix="/api", tags=["accounts"], responses=ERROR_RESPONSES)


def _sign_in(response: Response, db: DbSession, settings: Settings, user: User) -> LoginPublic:
    """Start a session and set its cookies: the HttpOnly session and the readable CSRF token."""
    token = accounts.start_session(db, settings, user)
    csrf = security.csrf_token(settings.secret, token)
    for name, value, httponly in ((SESSION_COOKIE, token, True), (CSRF_COOKIE, csrf, False)):
        response.set_cookie(name, value, max_age=settings.session_days * 86400, path="/", samesite="lax",
                            secure=settings.secure_cookies, httponly=httponly)
    return LoginPublic(user=UserPublic.model_validate(user), csrf_token=csrf)


@router.post("/auth/register", status_code=status.HTTP_201_CREATED, dependencies=[Public])
def register(body: UserCreate, response: Response, db: DbSession, settings: SettingsDep) -> LoginPublic:
    """Create an account and sign in to it."""
    user = accounts.register(db, settings, body.username, body.password)
    return _sign_in(response, db, settings, user)


@router.post("/auth/login", dependencies=[Public])
def login(body: LoginRequest, request: Request, response: Response, db: DbSession, settings: SettingsDep) -> LoginPublic:
    """Sign in with username and password; repeated failures are throttled (429 + Retry-After)."""
    client_ip = request.client.host if request.client else "unknown"
    user = accounts.authenticate(db, settings, body.username, body.password, client_ip)
    return _sign_in(response, db, settings, user)


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def logout(request: Request, response: Response, user: CurrentUser, db: DbSession) -> None:
    """End this browser session (API tokens stay valid until revoked)."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        accounts.end_session(db, token)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")


@router.get("/me")
def me(user: CurrentUser) -> UserPublic:
    return UserPublic.model_validate(user)


@router.post("/me/password")
def change_password(body: PasswordChange, request: Request, response: Response, user: CurrentUser, db: DbSession,
                    settings: SettingsDep) -> LoginPublic:
    """Change your password (the current one first; wrong guesses are throttled like sign-in). Every
    other browser session ends; this one goes on."""
    client_ip = request.client.host if request.client else "unknown"
    user = accounts.change_password(db, settings, user, body.current_password, body.new_password, client_ip)
    return _sign_in(response, db, settings, user)


@router.get("/tokens")
def list_tokens(user: CurrentUser, db: DbSession) -> list[TokenPublic]:
    return [TokenPublic.model_validate(t) for t in accounts.list_api_tokens(db, user)]


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, user: CurrentUser, db: DbSession) -> TokenCreated:
    """Create a personal API token for `Authorization: Bearer <token>`; it is shown only in this answer."""
    row, token = accounts.create_api_token(db, user, body.name)
    return TokenCreated(token=token, **TokenPublic.model_validate(row).model_dump())


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: RandomId, user: CurrentUser, db: DbSession) -> None:
    accounts.revoke_api_token(db, user, token_id)


component = Component(name="accounts", router=router)
