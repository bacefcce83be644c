"""Password hashing, random tokens and CSRF tokens: the server's only crypto."""

import hashlib
import hmac
import os
import secrets
import threading
from typing import TypedDict

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError


class Argon2Parameters(TypedDict):
    time_cost: int
    memory_cost: int
    parallelism: int


# Argon2id with OWASP's recommended minimum (19 MiB, 2 passes, 1 lane): ~35 ms of CPU here. The
# library's default (64 MiB, 3 passes, 4 lanes) cost ~0.3 s, so a class of 100 signing up at once
# needed half a minute of both cores. Hashes made with other parameters are redone at sign-in.
ARGON2_PARAMETERS: Argon2Parameters = {"time_cost": 2, "memory_cost": 19 * 1024, "parallelism": 1}
_hasher = PasswordHasher(**ARGON2_PARAMETERS)
# Verified against when the username is unknown, so a miss costs as much as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))
# Hashing is CPU work in the request threads: one per core at a time, the rest queue, so a burst
# of sign-ins cannot starve every other request.
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
