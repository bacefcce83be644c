"""Waiting, with a bound, for something another thread, process or service does: one way for every test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 5.0, pause: float = 0.05, what: str = "the condition") -> T:
    """check() until it returns something truthy, which is returned; an AssertionError naming `what`
    when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {timeout:g} s")
        time.sleep(pause)
    return value


async def eventually(check: Callable[[], T], timeout: float = 5.0, pause: float = 0.01,
                     what: str = "the condition") -> T:
    """wait_until for coroutines: the event loop keeps running between checks."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {timeout:g} s")
        await asyncio.sleep(pause)
    return value
