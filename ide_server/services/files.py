"""Project files on disk: tree, read, write, create, move, delete, zip download and upload.

Every path goes through `paths.normalise` and `paths.resolve` first; OS errors become domain
errors with the user's path in the message. Names on disk the API cannot carry as they are (not
UTF-8, control characters) are listed `paths.escape`d and can be read, renamed or deleted under
that name (`paths.existing`), so a project holding one can be repaired; the zip leaves them out.
"""

import errno
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from ide_server import paths
from ide_server.errors import Conflict, InvalidInput, NotFound, TooLarge

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Entry:
    path: str
    kind: Literal["file", "directory", "symlink"]
    size: int


def _shown(rel: str) -> str:
    """A path in a message, quoted as the tree shows it (a raw name from `paths.existing` escaped again)."""
    return f"'{paths.escape(rel)}'"


@contextmanager
def _os_errors(rel: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError:
        raise NotFound(f"{_shown(rel)} does not exist") from None
    except NotADirectoryError:
        raise NotFound(f"{_shown(rel)} does not exist (a parent is a file)") from None
    except IsADirectoryError:
        raise InvalidInput(f"{_shown(rel)} is a folder") from None
    except FileExistsError:
        raise Conflict(f"{_shown(rel)} already exists") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(f"{_shown(rel)} is a symlink that cannot be followed") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise InvalidInput(f"{_shown(rel)} is too long") from None
        raise


def tree(root: Path) -> list[Entry]:
    """Every entry under root, depth first and sorted by path; symlinks are listed, never followed.
    Paths are as the API shows them (`paths.escape`)."""
    entries: list[Entry] = []

    def walk(directory: Path, prefix: str) -> None:
        try:
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:  # removed while we walked
            return
        for item in items:
            rel = prefix + paths.escape(item.name)
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # e.g. an editor's temp file, renamed into place meanwhile
                continue
            if stat.S_ISLNK(info.st_mode):
                entries.append(Entry(rel, "symlink", 0))
            elif stat.S_ISDIR(info.st_mode):
                entries.append(Entry(rel, "directory", 0))
                walk(Path(item.path), rel + "/")
            elif stat.S_ISREG(info.st_mode):
                entries.append(Entry(rel, "file", info.st_size))
            # sockets, FIFOs and devices (which user code could make) are left out

    walk(root, "")
    return entries


def read(root: Path, path: str, max_bytes: int) -> bytes:
    rel = paths.existing(path)
    target = paths.resolve(root, rel)
    with _os_errors(rel):
        # O_NONBLOCK: opening a FIFO planted by user code must not hang the server.
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"{_shown(rel)} is not a regular file")
            if info.st_size > max_bytes:
                raise TooLarge(f"{_shown(rel)} is {info.st_size} bytes; files over {max_bytes} bytes can't be opened here")
            return f.read(max_bytes + 1)[:max_bytes]


def write(root: Path, path: str, data: bytes, max_bytes: int, create_only: bool = False) -> Entry:
    """Write a file (parents are created), atomically: readers see the old or the new content."""
    rel = paths.normalise(path)
    if len(data) > max_bytes:
        raise TooLarge(f"files may be at most {max_bytes} bytes")
    target = paths.resolve(root, rel)
    with _os_errors(rel):
        if target.is_dir() and not target.is_symlink():
            raise IsADirectoryError
        if create_only and os.path.lexists(target):
            raise FileExistsError
        _make_dirs(root, rel.rpartition("/")[0])
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".codeyard-upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)  # replaces a symlink itself, never what it points to
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return Entry(rel, "file", len(data))


def make_dir(root: Path, path: str) -> Entry:
    rel = paths.normalise(path)
    target = paths.resolve(root, rel, follow_last=False)
    with _os_errors(rel):
        if os.path.lexists(target):
            raise FileExistsError
        _make_dirs(root, rel)
    return Entry(rel, "directory", 0)


def _make_dirs(root: Path, rel: str) -> None:
    """Create `rel` and its parents one level at a time, re-checking confinement at each level."""
    if not rel:
        return
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        sub = "/".join(parts[:depth])
        target = paths.resolve(root, sub)
        with _os_errors(sub):
            if not target.is_dir():
                os.mkdir(target)


def move(root: Path, src: str, dst: str) -> Entry:
    src_rel, dst_rel = paths.existing(src), paths.normalise(dst)
    if dst_rel == src_rel or dst_rel.startswith(src_rel + "/"):
        raise InvalidInput("can't move a folder into itself")
    source = paths.resolve(root, src_rel, follow_last=False)
    dest = paths.resolve(root, dst_rel, follow_last=False)
    if not os.path.lexists(source):
        raise NotFound(f"{_shown(src_rel)} does not exist")
    if os.path.lexists(dest):
        raise Conflict(f"{dst_rel!r} already exists")
    _make_dirs(root, dst_rel.rpartition("/")[0])
    with _os_errors(dst_rel):
        os.rename(source, dest)
    return _entry(dest, dst_rel)


def delete(root: Path, path: str) -> None:
    """Delete a file, a symlink (not its target) or a folder with everything in it."""
    rel = paths.existing(path)
    target = paths.resolve(root, rel, follow_last=False)
    with _os_errors(rel):
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            os.unlink(target)


def _entry(target: Path, rel: str) -> Entry:
    info = os.lstat(target)
    if stat.S_ISLNK(info.st_mode):
        return Entry(rel, "symlink", 0)
    if stat.S_ISDIR(info.st_mode):
        return Entry(rel, "directory", 0)
    return Entry(rel, "file", info.st_size)


def zip_project(root: Path) -> IO[bytes]:
    """The project's files (symlinks left out) as a zip in a temporary file, rewound. Escaped names are
    left out too: a zip holds text names, and one with a '\\' would not upload again."""
    out = tempfile.SpooledTemporaryFile(max_size=16 * CHUNK)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for entry in tree(root):
            if "\\" in entry.path:
                continue
            if entry.kind == "directory":
                zf.writestr(entry.path + "/", b"")
            elif entry.kind == "file":
                zf.write(root / entry.path, entry.path)
    out.seek(0)
    return out


def iter_file(f: IO[bytes]) -> Iterator[bytes]:
    with f:
        while chunk := f.read(CHUNK):
            yield chunk


def unzip_into(root: Path, archive: IO[bytes], max_total: int, max_files: int, max_file: int) -> int:
    """Extract an uploaded zip into the project; returns the number of files written.

    Every name is checked before anything is written (no `..`, absolute names or symlink
    entries), and declared sizes bound the expanded size (zipfile never inflates past them).
    """
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, ValueError):
        raise InvalidInput("the upload is not a valid zip file") from None
    with zf:
        members = zf.infolist()
        if len(members) > max_files:
            raise TooLarge(f"the zip has {len(members)} entries; at most {max_files} are allowed")
        total = 0
        plan: list[tuple[zipfile.ZipInfo, str]] = []
        for info in members:
            if stat.S_ISLNK(info.external_attr >> 16):
                raise InvalidInput(f"the zip entry {info.filename!r} is a symlink; symlinks are not allowed")
            try:
                rel = paths.normalise(info.filename)
            except InvalidInput as exc:
                raise InvalidInput(f"the zip entry {info.filename!r} is refused: {exc.detail}") from None
            if info.file_size > max_file:
                raise TooLarge(f"the zip entry {rel!r} is larger than {max_file} bytes")
            total += info.file_size
            if total > max_total:
                raise TooLarge(f"the zip expands to more than {max_total} bytes")
            plan.append((info, rel))
        written = 0
        for info, rel in plan:
            if info.is_dir():
                _make_dirs(root, rel)
                continue
            try:
                data = zf.read(info)
            except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, EOFError, zlib.error) as exc:
                raise InvalidInput(f"the zip entry {rel!r} can't be read: {exc}") from None
            write(root, rel, data, max_file)
            written += 1
    return written
