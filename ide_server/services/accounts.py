"""Users, browser sessions and personal API tokens."""

import re
from datetime import timedelta

from sqlalchemy import bindparam, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ide_server import security
from ide_server.errors import Conflict, InvalidInput, NotAuthenticated, NotFound, PermissionDenied
from ide_server.models import ApiToken, LoginSession, User, utcnow
from ide_server.services import login_throttle
from ide_server.settings import Settings

USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{1,31}$")
USERNAME_RULE = "2-32 characters: lowercase letters, digits, '-' or '_', starting with a letter or digit"
API_TOKEN_PREFIX = "cy_"
# last_used_at is informative only: don't write it on every request.
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


def normalise_username(username: str) -> str:
    name = username.strip().lower()
    if not USERNAME_RE.match(name):
        raise InvalidInput(f"username must be {USERNAME_RULE}")
    return name


def create_user(db: Session, settings: Settings, username: str, password: str, is_admin: bool = False) -> User:
    name = normalise_username(username)
    _check_password(settings, password)
    if db.scalar(select(User.id).where(User.username == name)) is not None:
        raise Conflict(f"username {name!r} is taken")
    user = User(username=name, password_hash=security.hash_password(password), is_admin=is_admin)
    db.add(user)
    try:
        db.commit()
    except IntegrityError:  # a concurrent registration won the race
        db.rollback()
        raise Conflict(f"username {name!r} is taken") from None
    return user


def _check_password(settings: Settings, password: str) -> None:
    if len(password) < settings.password_min_length:
        raise InvalidInput(f"password must have at least {settings.password_min_length} characters")


def set_password(db: Session, settings: Settings, username: str, password: str) -> User:
    """Replace a password and end the user's browser sessions."""
    _check_password(settings, password)
    user = db.scalar(select(User).where(User.username == username.strip().lower()))
    if user is None:
        raise NotFound(f"no user named {username!r}")
    user.password_hash = security.hash_password(password)
    db.execute(delete(LoginSession).where(LoginSession.user_id == user.id))
    db.commit()
    return user


def change_password(db: Session, settings: Settings, user: User, current: str, new: str, client_ip: str) -> User:
    """A signed-in user's own change: the current password first (throttled like sign-in, so a stolen
    session cannot guess it), then every browser session ends (the caller starts a new one for the
    browser that asked)."""
    if not _password_matches(db, settings, login_throttle.throttle_key(user.username, client_ip),
                             user.password_hash, current):
        raise InvalidInput("the current password is not right")
    return set_password(db, settings, user.username, new)


def register(db: Session, settings: Settings, username: str, password: str) -> User:
    """Self-service sign-up, unless the server's admin closed it."""
    if not settings.allow_registration:
        raise PermissionDenied("sign-up is closed on this server; ask an admin for an account")
    return create_user(db, settings, username, password)


def authenticate(db: Session, settings: Settings, username: str, password: str, client_ip: str) -> User:
    """Check a password, throttled per username and client address."""
    key = login_throttle.throttle_key(username.strip(), client_ip)
    user = db.scalar(select(User).where(User.username == username.strip().lower()))
    matches = _password_matches(db, settings, key, user.password_hash if user else None, password)
    if user is None or not matches:  # an unknown name was checked against a dummy hash all the same
        raise NotAuthenticated("wrong username or password")
    if security.needs_rehash(user.password_hash):
        user.password_hash = security.hash_password(password)
        db.commit()
    return user


def _password_matches(db: Session, settings: Settings, key: str, password_hash: str | None, password: str) -> bool:
    """Check a password, counting failures under key; too many in the window answer 429 first."""
    login_throttle.check(db, key, settings.login_max_failures, settings.login_window_seconds)
    if not security.verify_password(password_hash, password):
        login_throttle.record_failure(db, key, settings.login_window_seconds)
        return False
    login_throttle.clear(db, key)
    return True


def start_session(db: Session, settings: Settings, user: User) -> str:
    """Returns the cookie value; the table keeps only its hash. Expired sessions are swept here."""
    db.execute(delete(LoginSession).where(LoginSession.expires_at < utcnow()))
    token = security.new_token()
    db.add(
        LoginSession(
            token_hash=security.token_hash(token),
            user_id=user.id,
            expires_at=utcnow() + timedelta(days=settings.session_days),
        )
    )
    db.commit()
    return token


# Built once: composing the statement cost more CPU than running it, and every request runs it.
_SESSION_USER = (
    select(User, LoginSession.expires_at)
    .join(LoginSession, LoginSession.user_id == User.id)
    .where(LoginSession.token_hash == bindparam("token_hash"))
)


def user_for_session(db: Session, token: str) -> User | None:
    """One query (every request asks it): the session's user and when the session expires."""
    found = db.execute(_SESSION_USER, {"token_hash": security.token_hash(token)}).first()
    if found is None or found.expires_at <= utcnow():
        return None
    user: User = found.User
    return user


def end_session(db: Session, token: str) -> None:
    db.execute(delete(LoginSession).where(LoginSession.token_hash == security.token_hash(token)))
    db.commit()


def create_api_token(db: Session, user: User, name: str) -> tuple[ApiToken, str]:
    """Returns the row and the token itself, which is shown once and never stored."""
    token = security.new_token(API_TOKEN_PREFIX)
    row = ApiToken(id=security.new_id(), user_id=user.id, name=name, token_hash=security.token_hash(token))
    db.add(row)
    db.commit()
    return row, token


def list_api_tokens(db: Session, user: User) -> list[ApiToken]:
    return list(db.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.created_at)))


def revoke_api_token(db: Session, user: User, token_id: str) -> None:
    row = db.get(ApiToken, token_id)
    if row is None or row.user_id != user.id:
        raise NotFound("no such token")
    db.delete(row)
    db.commit()


def user_for_api_token(db: Session, token: str) -> User | None:
    if not token.startswith(API_TOKEN_PREFIX):
        return None
    row = db.scalar(select(ApiToken).where(ApiToken.token_hash == security.token_hash(token)))
    if row is None:
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > TOKEN_TOUCH_INTERVAL:
        row.last_used_at = now
        db.commit()
    return row.user
