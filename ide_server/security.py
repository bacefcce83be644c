"""Password hashing, random tokens and CSRF tokens: the server's only crypto."""

import hashlib
import hmac
import os
import secrets
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()
# Verified against when the username is unknown, so a miss costs as much as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))
# A hash is ~0.3 s of CPU and 64 MiB on 4 threads: a class signing in at once ran 30 of them
# together, thrashing memory and starving every other request. One per core, the rest queue.
_hashing = threading.BoundedSemaphore(os.cpu_count() or 1)


def hash_password(password: str) -> str:
    with _hashing:
        return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        with _hashing:
            return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    return _hasher.check_needs_rehash(password_hash)


def new_token(prefix: str = "") -> str:
    """A random secret for cookies, API tokens and invite links (256 bits)."""
    return prefix + secrets.token_urlsafe(32)


def new_id() -> str:
    """A short random URL-safe id (72 bits) for projects, tokens and invites: not guessable, not sequential."""
    return secrets.token_urlsafe(9)


def token_hash(token: str) -> str:
    """What the database stores instead of a token; SHA-256 suffices for 256-bit random secrets."""
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(secret_key: str, session_token: str) -> str:
    """The CSRF token bound to one session: an HMAC of it, so it cannot be forged or planted."""
    return hmac.new(secret_key.encode(), b"csrf:" + session_token.encode(), hashlib.sha256).hexdigest()


def csrf_ok(secret_key: str, session_token: str, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(csrf_token(secret_key, session_token), presented)
