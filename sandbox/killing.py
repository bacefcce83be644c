"""SIGKILL a changing set of processes until none is left (a fork bomb keeps adding to it)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def kill_until_gone(list_pids: Callable[[], list[int]], rounds: int, pause: float) -> None:
    """Kill what `list_pids` names, up to `rounds` times, pausing between rounds for new children to show."""
    for round_number in range(rounds):
        pids = list_pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if round_number + 1 < rounds:
            time.sleep(pause)
