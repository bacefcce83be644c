"""SecretBox: seals project secrets with AES-256-GCM under a key derived from the server's key.

The server's secret key also signs sessions and CSRF tokens; HKDF derives a separate key for
secrets, so neither use can weaken the other. Each sealed value is bound (as associated data) to
its project and name, so a row copied to another project or renamed in the database fails to
open instead of leaking into the wrong app.
"""

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FORMAT = b"\x01"  # first byte of every sealed value: room for another scheme later
NONCE_BYTES = 12
HKDF_INFO = b"codeyard project secrets v1"


class SecretUnreadable(Exception):
    """A sealed value that does not open: another server key, or a tampered or moved row."""


class SecretBox:
    def __init__(self, server_key: str) -> None:
        if not server_key:
            raise ValueError("server_key: must not be empty")
        key = HKDF(algorithm=SHA256(), length=32, salt=None, info=HKDF_INFO).derive(server_key.encode())
        self._aead = AESGCM(key)

    def seal(self, value: str, project_id: str, name: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return FORMAT + nonce + self._aead.encrypt(nonce, value.encode(), _context(project_id, name))

    def open(self, sealed: bytes, project_id: str, name: str) -> str:
        if sealed[:1] != FORMAT:
            raise SecretUnreadable(f"secret {name} has an unknown format")
        nonce, body = sealed[1 : 1 + NONCE_BYTES], sealed[1 + NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, body, _context(project_id, name)).decode()
        except InvalidTag:
            raise SecretUnreadable(f"secret {name} cannot be decrypted with this server's key") from None


def _context(project_id: str, name: str) -> bytes:
    return f"{project_id}\0{name}".encode()
