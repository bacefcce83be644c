"""The lone request's window costs no more system calls than it needs (stop 32): the precise sleep
arms a timerfd it kept from the last sleep rather than making and closing one each time, and the
runnable count is one read of a /proc/loadavg kept open. Both ran cold on an isolated request's way
to the engine (the server had sat idle)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from llm_engine import cpu_contention, precise_sleep

linux_only = pytest.mark.skipif(precise_sleep._LIBC is None, reason="timerfd is Linux's")


@linux_only
def test_a_sleep_arms_the_timer_the_last_one_kept(monkeypatch):
    made: list[float] = []
    real = precise_sleep.timer_fd

    def counted(seconds: float) -> int | None:
        made.append(seconds)
        return real(seconds)

    monkeypatch.setattr(precise_sleep, "timer_fd", counted)
    monkeypatch.setattr(precise_sleep, "_IDLE", [])

    async def main() -> list[float]:
        slept = []
        for seconds in (0.002, 0.01, 0.0002):
            started = time.monotonic()
            await precise_sleep.sleep(seconds)
            slept.append(time.monotonic() - started)
        return slept

    slept = asyncio.run(main())
    assert made == [0.002]  # one timer for the three sleeps
    assert all(s >= asked for s, asked in zip(slept, (0.002, 0.01, 0.0002)))
    assert len(precise_sleep._IDLE) == 1


@linux_only
def test_a_kept_timer_that_fired_unread_does_not_cut_the_next_sleep_short(monkeypatch):
    """A sleeper cancelled before its timer fired leaves it armed; it fires unread while idle, and the
    next sleep on it must still last as long as asked (arming it again drops the old expiry)."""
    monkeypatch.setattr(precise_sleep, "_IDLE", [])

    async def main() -> float:
        task = asyncio.ensure_future(precise_sleep.sleep(0.001))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        time.sleep(0.005)  # the cancelled sleep's timer fires now, unread
        started = time.monotonic()
        await precise_sleep.sleep(0.03)
        return time.monotonic() - started

    assert asyncio.run(main()) >= 0.03
    assert len(precise_sleep._IDLE) == 1


@linux_only
def test_a_forked_child_drops_its_parents_timers(monkeypatch):
    monkeypatch.setattr(precise_sleep, "_IDLE", [])
    asyncio.run(precise_sleep.sleep(0.0001))
    assert len(precise_sleep._IDLE) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the timer is closed and forgotten
        os.write(write, bytes([len(precise_sleep._IDLE)]))
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"\x00"
    os.waitpid(pid, 0)
    os.close(read)
    assert len(precise_sleep._IDLE) == 1  # the parent keeps its own


def test_the_runnable_count_is_read_from_a_file_kept_open(monkeypatch, tmp_path):
    loadavg = tmp_path / "loadavg"
    kept = cpu_contention.KeptOpenFile(str(loadavg))
    monkeypatch.setattr(cpu_contention, "_LOADAVG", kept)
    opened: list[str] = []
    real_open = os.open

    def counted(path: str, *args: int) -> int:
        opened.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(cpu_contention.os, "open", counted)
    answers = []
    for runnable in (1, 3, 1):
        loadavg.write_text(f"0.52 0.40 0.77 {runnable}/110 25248\n")
        answers.append(cpu_contention.others_runnable())
    assert answers == [False, True, False]  # each read sees the file as it is now
    assert opened == [str(loadavg)]
    kept.close()


def test_proc_loadavg_read_again_is_fresh():
    """The kernel writes /proc/loadavg's text afresh for each read from its start."""
    if not os.path.exists(cpu_contention.LOADAVG):
        pytest.skip("no /proc/loadavg")
    kept = cpu_contention.KeptOpenFile(cpu_contention.LOADAVG)
    first, again = kept.read(), kept.read()
    assert cpu_contention.runnable_tasks(first) >= 1 and cpu_contention.runnable_tasks(again) >= 1
    assert kept.fd is not None
    kept.close()
