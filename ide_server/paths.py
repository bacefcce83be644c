"""Path rules for project files: the one place that turns user input into a path on disk.

`normalise` checks the text of a path (no `..`, no absolute paths, no NUL or backslashes, no
percent-encoded traversal, bounded lengths). `resolve` maps it into a project folder and refuses
any path that a symlink leads out of that folder; callers then open the final component with
O_NOFOLLOW, so a symlink swapped in at the last moment is not followed either.
"""

import os
import string
from pathlib import Path
from urllib.parse import unquote

from ide_server.errors import InvalidInput

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
_CONTROL = set(chr(c) for c in range(32)) | {"\x7f"}
_HEX = set(string.hexdigits)


def normalise(path: str) -> str:
    """The canonical form `a/b/c` of a project-relative path; InvalidInput if it is not one."""
    if "\x00" in path:
        raise InvalidInput("path must not contain NUL bytes")
    if "\\" in path:
        raise InvalidInput("path must use '/' as separator, not '\\'")
    if path.startswith("/"):
        raise InvalidInput("path must be relative to the project, not absolute")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise InvalidInput("path is empty")
    for part in parts:
        if part == "..":
            raise InvalidInput("path must not contain '..'")
        if _CONTROL.intersection(part):
            raise InvalidInput("path must not contain control characters")
        if "%" in part and _decodes_to_traversal(part):
            raise InvalidInput("path must not contain percent-encoded '.', '..' or separators")
        if len(part.encode()) > MAX_NAME_BYTES:
            raise InvalidInput(f"a file or folder name is longer than {MAX_NAME_BYTES} bytes")
    joined = "/".join(parts)
    if len(joined.encode()) > MAX_PATH_BYTES:
        raise InvalidInput(f"path is longer than {MAX_PATH_BYTES} bytes")
    return joined


def _decodes_to_traversal(part: str) -> bool:
    """Would decoding (once or repeatedly) turn this name into '.', '..' or something with a separator?"""
    for _ in range(3):
        decoded = unquote(part)
        if decoded == part:
            return False
        if decoded in (".", "..") or "/" in decoded or "\\" in decoded or "\x00" in decoded:
            return True
        part = decoded
    return True


def is_inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve(root: Path, rel: str, follow_last: bool = True) -> Path:
    """The on-disk path of normalised `rel` inside `root`, with every symlink kept inside `root`.

    follow_last=False leaves a symlink in the last component as it is (to rename or delete the
    link itself). Raises InvalidInput when a symlink leads outside the project.
    """
    root_real = os.path.realpath(root)
    parent_rel, _, name = rel.rpartition("/")
    parent = os.path.realpath(os.path.join(root_real, parent_rel))
    if not is_inside(root_real, parent):
        raise InvalidInput(f"{rel!r} goes through a symlink that points outside the project")
    target = os.path.join(parent, name)
    if follow_last and os.path.islink(target):
        target = os.path.realpath(target)
        if not is_inside(root_real, target):
            raise InvalidInput(f"{rel!r} is a symlink that points outside the project")
    return Path(target)
