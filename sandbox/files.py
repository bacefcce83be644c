"""Copy a project into a run's workspace and the program's new files back, never following a symlink.

The workspace is controlled by untrusted code, so every path is opened relative to a directory
descriptor with O_NOFOLLOW: a symlink the sandbox leaves behind is skipped, never read through or
written through (the host-follows-a-symlink class of sandbox escapes).

A file whose path the files API would refuse (not UTF-8, control characters such as a newline, a
backslash, too long: `paths.problem`) is not copied back either: the IDE could not show, edit or
delete it, and its name would break every JSON answer that carries it. The run's message names it.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ide_server import paths

EXCLUDED_NAMES = frozenset({".git"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class WorkspaceTooLarge(ValueError):
    """The project does not fit in the run's workspace quota."""


@dataclass
class Snapshot:
    """What was copied in: relative path -> (size, mtime_ns), to tell which files the run changed."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


@dataclass
class CopyReport:
    """What copy_out did. Paths are as the files API shows them (`paths.escape`), so any may go into JSON."""

    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bad_names: dict[str, str] = field(default_factory=dict)  # path -> why the API cannot take its name
    copied: dict[str, tuple[int, int]] = field(default_factory=dict)  # raw path -> (size, mtime_ns) as copied, for a later copy_out

    def notice(self, listed: int = 5) -> str:
        """The line for the run's message naming the files left in the sandbox for their names ("" if none)."""
        if not self.bad_names:
            return ""
        shown = [f"'{path}' ({why})" for path, why in list(self.bad_names.items())[:listed]]
        if len(self.bad_names) > listed:
            shown.append(f"and {len(self.bad_names) - listed} more")
        return (f"skipped {len(self.bad_names)} file(s) with a name the IDE cannot show, not copied back to the project "
                f"(rename them in the program): {', '.join(shown)}")


def _listing(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of a folder's entries, sorted; an entry removed while we look (an editor's
    temp file being renamed into place) is simply not there."""
    items = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                items.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
    return sorted(items)


def _walk(root_fd: int, prefix: str = "") -> Iterator[tuple[int, str, str, os.stat_result]]:
    """Yield (dir_fd, name, relpath, stat) for every entry under root_fd, without following links."""
    for name, st in _listing(root_fd):
        if name in EXCLUDED_NAMES:
            continue
        rel = f"{prefix}{name}"
        yield root_fd, name, rel, st
        if stat.S_ISDIR(st.st_mode):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError:
                continue
            try:
                yield from _walk(fd, rel + "/")
            finally:
                os.close(fd)


def _copy_fd(src_fd: int, dst_fd: int, limit: int) -> int:
    copied = 0
    while chunk := os.read(src_fd, _CHUNK):
        copied += len(chunk)
        if copied > limit:
            raise WorkspaceTooLarge("file larger than the limit")
        os.write(dst_fd, chunk)
    return copied


def _open_dirs(root_fd: int, parts: list[str], create: bool) -> int:
    """Descend (and optionally create) parts under root_fd; raises OSError on a symlink or non-dir."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def copy_in(project: Path, workspace: Path, *, max_bytes: int, max_files: int, owner: int | None) -> Snapshot:
    """Copy the project's regular files and folders into the workspace; symlinks and devices are skipped."""
    snap = Snapshot()
    total = 0
    src_root = os.open(project, _DIR_FLAGS)
    dst_root = os.open(workspace, _DIR_FLAGS)
    try:
        dst_dirs = {"": dst_root}
        for dir_fd, name, rel, st in _walk(src_root):
            parent = rel.rpartition("/")[0]
            if parent not in dst_dirs:
                continue
            pfd = dst_dirs[parent]
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o755, dir_fd=pfd)
                dst_dirs[rel] = os.open(name, _DIR_FLAGS, dir_fd=pfd)
                if owner is not None:
                    os.chown(dst_dirs[rel], owner, owner)
                continue
            if not stat.S_ISREG(st.st_mode):
                snap.skipped.append(paths.escape(rel))
                continue
            if len(snap.files) >= max_files:
                raise WorkspaceTooLarge(f"the project has more than {max_files} files")
            total += st.st_size
            if total > max_bytes:
                raise WorkspaceTooLarge(f"the project is larger than the workspace quota of {max_bytes} bytes")
            src = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
            try:
                dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, st.st_mode & 0o755 | 0o600, dir_fd=pfd)
                try:
                    _copy_fd(src, dst, max_bytes)
                    if owner is not None:
                        os.fchown(dst, owner, owner)
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(dst)
            finally:
                os.close(src)
            snap.files[rel] = (st.st_size, st.st_mtime_ns)
        if owner is not None:
            os.chown(dst_root, owner, owner)
    finally:
        for rel, fd in dst_dirs.items():
            if rel:
                os.close(fd)
        os.close(src_root)
        os.close(dst_root)
    return snap


def copy_out(workspace: Path, project: Path, snapshot: Snapshot, *, max_bytes: int, max_files: int) -> CopyReport:
    """Copy files the run created or changed back into the project, atomically and without following links.

    Deleted files are not propagated: a run can add and change files, not remove the user's work.
    Nor are files whose names the API cannot take (`paths.problem`); `report.bad_names` lists them.
    """
    report = CopyReport()
    total = 0
    src_root = os.open(workspace, _DIR_FLAGS)
    dst_root = os.open(project, _DIR_FLAGS)
    try:
        for dir_fd, name, rel, st in _walk(src_root):
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                report.skipped.append(paths.escape(rel))
                continue
            if snapshot.files.get(rel) == (st.st_size, st.st_mtime_ns):
                continue
            if why := paths.problem(rel):
                shown = paths.escape(rel)
                report.skipped.append(shown)
                report.bad_names[shown] = why
                continue
            total += st.st_size
            if len(report.written) >= max_files or total > max_bytes:
                report.skipped.append(rel)
                continue
            try:
                _copy_back(dir_fd, name, dst_root, rel, max_bytes)
            except (OSError, WorkspaceTooLarge):
                report.skipped.append(rel)
                continue
            report.written.append(rel)
            report.copied[rel] = (st.st_size, st.st_mtime_ns)
    finally:
        os.close(src_root)
        os.close(dst_root)
    return report


def _copy_back(src_dir_fd: int, name: str, dst_root: int, rel: str, max_bytes: int) -> None:
    parts = rel.split("/")[:-1]
    src = os.open(name, _READ_FLAGS, dir_fd=src_dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError("not a regular file")
        dfd = _open_dirs(dst_root, parts, create=True)
        try:
            # a short name of its own: ".{name}..." would pass 255 bytes for a long name and never come back
            tmp = f".codeyard-{secrets.token_hex(8)}.tmp"
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            try:
                try:
                    _copy_fd(src, dst, max_bytes)
                finally:
                    os.close(dst)
                # rename replaces a symlink at the destination itself; it never writes through it
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                os.unlink(tmp, dir_fd=dfd)
                raise
        finally:
            os.close(dfd)
    finally:
        os.close(src)
