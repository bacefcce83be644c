"""A host child process driven from asyncio: piped output to a SandboxRun, buffered stdin, exit via pidfd.

Waiting on a pidfd with os.wait4 (instead of asyncio's child watcher) gives the resource usage of
the whole reaped tree, needs no thread per run, and works for many concurrent runs.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import resource
import signal
import struct
import subprocess
import termios
from typing import Literal

from sandbox.backend import ExitStatus, SandboxRun

MAX_STDIN_BUFFER = 1 << 20
READ_CHUNK = 256 * 1024


class _FdReader:
    """Reads one descriptor it owns through loop.add_reader, passing output to the run, closing it at the end.

    Not a pipe transport: uvloop's connect_read_pipe/connect_write_pipe close the descriptor twice
    (libuv and the file object each close the same number), and under load the second close hit
    a descriptor another thread had just opened (a git checkpoint's pipe failed with EBADF).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, run: SandboxRun,
                 stream: Literal["stdout", "stderr"], done: asyncio.Future[None]) -> None:
        os.set_blocking(fd, False)
        self._loop, self._fd, self._run, self._stream, self._done = loop, fd, run, stream, done
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: a terminal whose last holder exited
            data = b""
        if data:
            self._run.emit(self._stream, data)
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        if not self._done.done():
            self._done.set_result(None)


class _FdWriter:
    """Buffered, non-blocking writes to a descriptor it owns (a pipe or a PTY master) through loop.add_writer.

    Not a pipe transport (see _FdReader); for a PTY one would also be wrong, since the master is
    readable too and uvloop's write-pipe transport reads from it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        os.set_blocking(fd, False)
        self._loop, self._fd, self._buffer, self._closed = loop, fd, bytearray(), False
        self._watching = False  # registered with the loop: must be undone before the descriptor closes

    def is_closing(self) -> bool:
        return self._closed

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def write(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self._buffer += data
        if not self._watching:
            self._loop.add_writer(self._fd, self._flush)
            self._watching = True

    def _flush(self) -> None:
        try:
            written = os.write(self._fd, self._buffer)
        except BlockingIOError:
            return
        except OSError:  # the reader is gone: nothing more can be delivered
            written = len(self._buffer)
        del self._buffer[:written]
        if not self._buffer:
            self._unwatch()
            if self._closed:
                self._release()

    def close(self) -> None:
        """No more writes; the descriptor closes once what is buffered has been delivered."""
        self._closed = True
        if not self._buffer:
            self._release()

    def abort(self) -> None:
        """Close now, dropping what is buffered (the process has exited: nobody will read it)."""
        self._closed = True
        self._buffer.clear()
        self._release()

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_writer(self._fd)
            self._watching = False

    def _release(self) -> None:
        """Stop watching, then close, once: a number left registered, or closed twice, would hit
        whatever descriptor takes that number next."""
        if self._fd >= 0:
            self._unwatch()
            os.close(self._fd)
            self._fd = -1


class HostProcess:
    """Spawn argv with pipes (or one terminal); `wait` returns after exit and end of output."""

    def __init__(self, popen: subprocess.Popen[bytes], terminal: int | None = None) -> None:
        self.popen = popen
        self.terminal = terminal  # the PTY master, for resizing
        self.pidfd = os.pidfd_open(popen.pid)
        self._stdin: _FdWriter | None = None
        self._eof: list[asyncio.Future[None]] = []
        self._exited = False

    @classmethod
    async def spawn(cls, argv: list[str], run: SandboxRun, env: dict[str, str], cwd: str,
                    pass_fds: tuple[int, ...] = ()) -> HostProcess:
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            popen = subprocess.Popen(argv, stdin=stdin_r, stdout=stdout_w, stderr=stderr_w, env=env, cwd=cwd,
                                     start_new_session=True, close_fds=True, pass_fds=pass_fds)
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        proc = cls(popen)
        loop = asyncio.get_running_loop()
        proc._read(loop, run, stdout_r, "stdout")
        proc._read(loop, run, stderr_r, "stderr")
        proc._stdin = _FdWriter(loop, stdin_w)
        return proc

    @classmethod
    async def spawn_terminal(cls, argv: list[str], run: SandboxRun, env: dict[str, str], cwd: str,
                             pass_fds: tuple[int, ...] = (), *, size: tuple[int, int]) -> HostProcess:
        """Spawn argv as a session leader whose controlling terminal is a new PTY (output comes as stdout)."""
        master, slave = os.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
        try:
            # setsid --ctty: new session (its pid is the process group killpg uses) owning the PTY
            popen = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=cwd, close_fds=True, pass_fds=pass_fds)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        proc = cls(popen, terminal=master)
        loop = asyncio.get_running_loop()
        # Reader and writer each own a duplicate and close it; `terminal` stays for resizing.
        proc._read(loop, run, os.dup(master), "stdout")
        proc._stdin = _FdWriter(loop, os.dup(master))
        return proc

    def _read(self, loop: asyncio.AbstractEventLoop, run: SandboxRun, fd: int, stream: Literal["stdout", "stderr"]) -> None:
        done: asyncio.Future[None] = loop.create_future()
        _FdReader(loop, fd, run, stream, done)
        self._eof.append(done)

    def resize(self, rows: int, cols: int) -> None:
        if self.terminal is None:
            raise ValueError("resize: this run has no terminal")
        fcntl.ioctl(self.terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin is None or self._stdin.is_closing():
            return
        if self._stdin.get_write_buffer_size() + len(data) > MAX_STDIN_BUFFER:
            raise ValueError("stdin: more than 1 MiB is waiting to be read by the program")
        self._stdin.write(data)

    async def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    def kill(self) -> None:
        if self._exited:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def wait(self) -> tuple[int, resource.struct_rusage]:
        """Exit status (as os.wait4 reports it) and rusage, after the output pipes closed."""
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def note_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self.pidfd, note_exit)
        try:
            await exited
        finally:
            loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
        _, status, usage = os.wait4(self.popen.pid, 0)
        self._exited = True
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        await asyncio.gather(*self._eof)
        if self._stdin is not None:
            self._stdin.abort()
        if self.terminal is not None:
            os.close(self.terminal)
            self.terminal = None
        return status, usage


def exit_status(status: int, usage: resource.struct_rusage) -> ExitStatus:
    """Translate a wait status whose exit code follows the 128+signal convention of bwrap and docker-init."""
    code = os.waitstatus_to_exitcode(status)
    # ru_maxrss is not used: a vfork'ed child starts out sharing (and reporting) the server's own memory
    result = ExitStatus(cpu_seconds=usage.ru_utime + usage.ru_stime)
    if code < 0:
        result.signal = -code
    elif code > 128 and code - 128 < signal.NSIG:
        result.signal = code - 128
    else:
        result.exit_code = code
    return result
