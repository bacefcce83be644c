"""Is a run's program waiting for input? Read from the kernel's view of its processes, never asked of the program.

Interactive runs (started from the editor) count wall time only while their program is not waiting
for input, so a learner who pauses at `input()` keeps the run. A program is waiting when one of its
threads is blocked reading its stdin, a pipe or terminal (`input()`, `scanf`, `read`), or is in `epoll_wait`
with its stdin among the watched descriptors (Node's readline). A program that sleeps, or whose
event loop waits on timers only, is not waiting for input, so its wall limit still holds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

# Kernel functions (wchan) a thread blocked reading a pipe or terminal sleeps in; names vary between kernels.
_READ_WAITS = ("pipe_read", "n_tty_read", "wait_woken", "tty_read")
_EPOLL_WAITS = ("epoll_wait", "ep_poll")
_WATCHES_STDIN = re.compile(r"^tfd:\s+0\s", re.MULTILINE)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process ended meanwhile
        return ""


def _reads_stdin(pid: int, tid: str) -> bool:
    """Whether the thread's blocking call has fd 0 as its first argument (read(0, ...), not a child's pipe)."""
    fields = _read(f"/proc/{pid}/task/{tid}/syscall").split()
    return len(fields) > 1 and fields[1] == "0x0"


def _watches_stdin(pid: int) -> bool:
    """Whether one of the process's epoll sets watches its fd 0."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[eventpoll]" and _WATCHES_STDIN.search(_read(f"/proc/{pid}/fdinfo/{fd}")):
                return True
        except OSError:
            continue
    return False


def waiting_for_input(pids: Iterable[int]) -> bool:
    """Whether a thread of these processes is blocked waiting for input on stdin (see the module's docstring)."""
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        wchans = {tid: _read(f"/proc/{pid}/task/{tid}/wchan") for tid in threads}
        if any(w.endswith(_READ_WAITS) and _reads_stdin(pid, tid) for tid, w in wchans.items()):
            return True
        if any(w.endswith(_EPOLL_WAITS) for w in wchans.values()) and _watches_stdin(pid):
            return True
    return False


_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _own_network(pid: int) -> bool:
    """Whether pid is in a network namespace of its own, not the server's (bubblewrap's monitor, which is in
    the run's cgroup, stays in the host's: its sockets are the host's)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def listening_ports(pids: Iterable[int]) -> set[int]:
    """TCP ports a program listens on in the run's network namespace (read through one of its processes)."""
    for pid in pids:
        if not _own_network(pid):
            continue
        ports = set()
        for table in ("tcp", "tcp6"):
            for line in _read(f"/proc/{pid}/net/{table}").splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == _LISTEN:
                    ports.add(int(fields[1].rpartition(":")[2], 16))
        return ports
    return set()
