"""Search across a project's text files, for the workspace's results panel (as VS Code's or Replit's Search).

Files are read through `files.read` (confined, no symlink followed); binary files (a NUL byte near the
start), large files and generated folders are skipped, and the answer is bounded, saying when it was cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ide_server.errors import DomainError
from ide_server.services import files

GENERATED = frozenset({"__pycache__", "node_modules", ".venv", "venv", ".git", ".pytest_cache", ".mypy_cache"})
MAX_FILE_BYTES = 1 << 20
MAX_MATCHES = 500
SHOWN_CHARS = 200  # of a matching line


@dataclass(frozen=True)
class Match:
    path: str
    line: int  # 1-based
    column: int  # 1-based, in characters
    text: str  # the line, cut to SHOWN_CHARS


def search(root: Path, query: str, case_sensitive: bool = False, limit: int = MAX_MATCHES) -> tuple[list[Match], bool]:
    """Lines containing `query`, file by file in tree order; and whether there were more than `limit`."""
    needle = query if case_sensitive else query.lower()
    found: list[Match] = []
    for entry in files.tree(root):
        if entry.kind != "file" or entry.size > MAX_FILE_BYTES or "\\" in entry.path:
            continue
        if GENERATED.intersection(entry.path.split("/")):
            continue
        try:
            data = files.read(root, entry.path, MAX_FILE_BYTES)
        except DomainError:  # removed or replaced while we walked
            continue
        if b"\0" in data[:8192]:
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            column = (line if case_sensitive else line.lower()).find(needle)
            if column < 0:
                continue
            if len(found) == limit:
                return found, True
            found.append(Match(entry.path, number, column + 1, line[:SHOWN_CHARS]))
    return found, False
