r"""Path rules for project files: the one place that turns user input into a path on disk.

`normalise` checks the text of a path (no `..`, no absolute paths, no NUL or backslashes, no
control characters, valid UTF-8, no percent-encoded traversal, bounded lengths). `resolve` maps it
into a project folder and refuses any path that a symlink leads out of that folder; callers then
open the final component with O_NOFOLLOW, so a symlink swapped in at the last moment is not
followed either.

A name already on disk that `normalise` refuses (bytes that are not UTF-8, a newline: a shell or
an older server can leave one) is shown `escape`d, each offending byte as `\xHH`. No accepted
path has a backslash, so an escaped path never names an ordinary file; `existing` turns it back
into the name on disk, so such an entry can still be read, renamed or deleted, and nothing else.
"""

import os
import re
import string
from pathlib import Path
from urllib.parse import unquote

from ide_server.errors import InvalidInput

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
_CONTROL = set(chr(c) for c in range(32)) | {"\x7f"}
_HEX = set(string.hexdigits)
_UNSHOWN_BYTE = re.compile(rb"[\x00-\x1f\x7f\\%]")  # escaped in a refused name, besides bytes that are not UTF-8
_ESCAPED_BYTE = re.compile(rb"\\x([0-9a-f]{2})")


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
        if problem := _part_problem(part):
            raise InvalidInput(problem)
    joined = "/".join(parts)
    if len(joined.encode()) > MAX_PATH_BYTES:
        raise InvalidInput(f"path is longer than {MAX_PATH_BYTES} bytes")
    return joined


def _part_problem(part: str) -> str | None:
    """Why one file or folder name is refused, or None."""
    if part == "..":
        return "path must not contain '..'"
    if "\\" in part:
        return "path must use '/' as separator, not '\\'"
    if _CONTROL.intersection(part):
        return "path must not contain control characters"
    if not _is_utf8(part):
        return "path must be valid UTF-8"
    if "%" in part and _decodes_to_traversal(part):
        return "path must not contain percent-encoded '.', '..' or separators"
    if len(part.encode()) > MAX_NAME_BYTES:
        return f"a file or folder name is longer than {MAX_NAME_BYTES} bytes"
    return None


def _is_utf8(text: str) -> bool:
    r"""False with lone surrogates: bytes that were not UTF-8 on disk (os.fsdecode), or a JSON "\udcff"."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def problem(rel: str) -> str | None:
    """Why the API could not take this relative path as it is, or None (e.g. for a name a program wrote)."""
    try:
        normalise(rel)
    except InvalidInput as exc:
        return exc.detail
    return None


def escape(rel: str) -> str:
    r"""How the API shows a relative path read from disk (os.fsdecode'd): each name `normalise` refuses has
    its bytes that are not UTF-8, control characters, backslashes and '%' written as `\xHH`; others stay."""
    return "/".join(_escape_name(part) if _part_problem(part) else part for part in rel.split("/"))


def _escape_name(name: str) -> str:
    raw = _UNSHOWN_BYTE.sub(lambda m: b"\\x%02x" % m[0][0], os.fsencode(name))
    return raw.decode("utf-8", "backslashreplace")  # what is left that is not UTF-8 becomes \xHH too


def existing(path: str) -> str:
    """The relative name on disk (os.fsdecode'd) of a path as the file tree shows it: an escaped path (with
    a backslash) is turned back into the raw name, any other goes through `normalise`. For reading, renaming
    or deleting an entry that exists: nothing is ever created under a name the API cannot show."""
    if "\\" not in path or path.startswith("/"):
        return normalise(path)
    names = []
    for part in (p for p in path.split("/") if p not in ("", ".")):
        try:
            name = os.fsdecode(_ESCAPED_BYTE.sub(lambda m: bytes.fromhex(m[1].decode()), os.fsencode(part)))
        except UnicodeEncodeError:
            raise InvalidInput("path must be valid UTF-8") from None
        # one spelling per name, the tree's: no '..', '/' or second spelling of a plain name hides behind it
        if "\\" in part and ("\x00" in name or not _part_problem(name) or _escape_name(name) != part):
            raise InvalidInput(f"{part!r}: a '\\' appears only in names the file tree shows escaped (as \\xHH); "
                               "use '/' as separator")
        if "\\" not in part and (problem := _part_problem(name)):
            raise InvalidInput(problem)
        names.append(name)
    if not names:
        raise InvalidInput("path is empty")
    return "/".join(names)


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
