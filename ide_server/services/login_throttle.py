"""Login throttling: too many failures for one username from one address answer 429 for a while.

Failures are rows in the database, so every app replica sees the same count.
"""

from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ide_server.errors import Throttled
from ide_server.models import LoginFailure, utcnow


def throttle_key(username: str, client_ip: str) -> str:
    return f"{username.lower()[:100]}|{client_ip[:90]}"


def check(db: Session, key: str, max_failures: int, window_seconds: int) -> None:
    """Raise Throttled (with Retry-After) when `key` used up its failures in the window."""
    since = utcnow() - timedelta(seconds=window_seconds)
    count, oldest = db.execute(
        select(func.count(), func.min(LoginFailure.failed_at)).where(
            LoginFailure.key == key, LoginFailure.failed_at > since
        )
    ).one()
    if count >= max_failures:
        oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=since.tzinfo)
        retry_after = max(1, int((oldest - since).total_seconds()) + 1)
        raise Throttled(f"too many failed logins; try again in {retry_after} seconds", retry_after)


def record_failure(db: Session, key: str, window_seconds: int) -> None:
    db.execute(delete(LoginFailure).where(LoginFailure.failed_at < utcnow() - timedelta(seconds=window_seconds)))
    db.add(LoginFailure(key=key))
    db.commit()


def clear(db: Session, key: str) -> None:
    db.execute(delete(LoginFailure).where(LoginFailure.key == key))
    db.commit()
