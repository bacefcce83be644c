"""The shared download cache takes only files the package index vouches for.

An install's downloads were written by a sandbox that also ran a package's build code, so they
are untrusted. The host shares one with later installs only when its sha256 equals the hash the
index publishes for that exact file name (PEP 691 JSON, fetched by the host itself): a hostile
setup.py can then neither plant a new file (say six-99.0) nor swap the bytes of a genuine one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import httpx
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

log = logging.getLogger(__name__)
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def project_of(filename: str) -> str | None:
    """The canonical project name of a wheel or sdist file name, else None."""
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[0]
        return parse_sdist_filename(filename)[0]
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def index_hashes(client: httpx.AsyncClient, index_url: str, project: str) -> dict[str, str]:
    """file name -> sha256 of every file the index lists for `project` ({} when it cannot say)."""
    try:
        answer = await client.get(f"{index_url.rstrip('/')}/{canonicalize_name(project)}/", headers={"Accept": SIMPLE_JSON})
        if answer.status_code != 200 or not answer.headers.get("content-type", "").startswith(SIMPLE_JSON):
            return {}
        return {f["filename"]: f["hashes"]["sha256"] for f in answer.json().get("files", [])
                if isinstance(f, dict) and isinstance(f.get("hashes"), dict) and "sha256" in f["hashes"]}
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not read %s's hashes from %s: %s", project, index_url, exc)
        return {}


async def share_verified(downloads: Path, shared: Path, index_url: str | None) -> list[str]:
    """Copy into `shared` each download the index vouches for; returns the names newly shared."""
    if index_url is None or not downloads.is_dir():
        return []
    shared_now: list[str] = []
    hashes: dict[str, dict[str, str]] = {}
    async with httpx.AsyncClient(timeout=30, follow_redirects=True) as client:
        for entry in sorted(os.scandir(downloads), key=lambda e: e.name):
            project = project_of(entry.name)
            if project is None or not entry.is_file(follow_symlinks=False) or (shared / entry.name).exists():
                continue
            if project not in hashes:
                hashes[project] = await index_hashes(client, index_url, project)
            expected = hashes[project].get(entry.name)
            if expected is None:
                continue
            fd, tmp = tempfile.mkstemp(dir=shared, prefix=".incoming-")
            os.close(fd)
            try:
                with open(entry.path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as src, open(tmp, "wb") as dst:
                    while block := src.read(1 << 20):
                        dst.write(block)
                if sha256_of(Path(tmp)) == expected:  # the bytes we keep are the bytes we checked
                    os.chmod(tmp, 0o644)
                    os.rename(tmp, shared / entry.name)
                    shared_now.append(entry.name)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return shared_now
