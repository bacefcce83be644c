"""A sleep on an asyncio event loop that can be shorter than a millisecond. uvloop's timers (libuv's)
count whole milliseconds: `asyncio.sleep(0.001)` takes 1.1 ms at the median and up to 2, and
anything under 0.5 ms rounds to the next loop pass. A Linux timerfd watched by the loop fires
within the kernel's timer slack (~50 us) of the time asked, and meanwhile the loop serves on (the
thread holds neither the CPU nor the GIL). Elsewhere, or when no timerfd can be made, it is
`asyncio.sleep`.

A timer is armed again for the next sleep rather than made and closed each time (stop 32): an
isolated request sleeps once, after the server sat idle, and runs each call cold (making a timerfd
there, ~90 us of thread CPU in a cold loop); re-arming a kept one is one call (`timerfd_settime`
also drops an expiry not yet read, so a timer that fired after its sleeper left cuts no sleep short).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys

_CLOCK_MONOTONIC = 1
# timerfd_create's TFD_NONBLOCK and TFD_CLOEXEC are O_NONBLOCK and O_CLOEXEC (linux/timerfd.h).
_FLAGS = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec)]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


# Timers of this process between sleeps (a forked child closes its copies: they would be its
# parent's timers too), at most _KEPT of them.
_IDLE: list[int] = []
_KEPT = 8


def timer_fd(seconds: float) -> int | None:
    """A non-blocking timerfd that becomes readable `seconds` from now (None where there is none)."""
    if _LIBC is None:
        return None
    fd: int = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _FLAGS)
    if fd < 0:
        return None
    if not _arm(fd, seconds):
        os.close(fd)
        return None
    return fd


def _arm(fd: int, seconds: float) -> bool:
    """Arm the timerfd `fd` to fire once, `seconds` from now; any expiry not yet read is dropped."""
    assert _LIBC is not None
    whole = int(seconds)
    # A zero it_value would disarm the timer: the shortest sleep is a nanosecond.
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(whole, max(1, int((seconds - whole) * 1e9))))
    return bool(_LIBC.timerfd_settime(fd, 0, ctypes.byref(spec), None) >= 0)


def _armed_timer(seconds: float) -> int | None:
    """An idle timer armed again, else a new one (`timer_fd`)."""
    while True:
        try:
            fd = _IDLE.pop()  # one step under the GIL: loops in other threads take their own
        except IndexError:
            return timer_fd(seconds)
        if _arm(fd, seconds):
            return fd
        os.close(fd)


def _put_back(fd: int) -> None:
    if len(_IDLE) < _KEPT:
        _IDLE.append(fd)
    else:
        os.close(fd)


def _close_idle() -> None:
    while _IDLE:
        os.close(_IDLE.pop())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_idle)


def _end(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


async def sleep(seconds: float) -> None:
    """`asyncio.sleep(seconds)` to within the timer slack, below a millisecond too."""
    if seconds < 0:
        raise ValueError(f"seconds: must be >= 0, got {seconds!r}")
    loop = asyncio.get_running_loop()
    fd = _armed_timer(seconds)
    if fd is None:
        await asyncio.sleep(seconds)
        return
    done: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _end, done)
    try:
        await done
    finally:
        try:
            loop.remove_reader(fd)
        except RuntimeError:  # the loop is closing under a cancelled sleeper
            os.close(fd)
        else:
            _put_back(fd)
