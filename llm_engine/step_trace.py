"""A per-step trace of the engine loop, to find what the slow steps behind a TPOT tail contain.

Set `CODEYARD_STEP_TRACE` to a folder: every engine loop started after that (an engine-core
process, an in-thread engine) appends one JSON line per step to `steps-<pid>.jsonl` there, where
<pid> is the process running the loop. A line holds when the step began (`t`, time.time(), so a
client on the same host can line it up with its own clock), its wall and thread-CPU seconds
(`wall`, `cpu`: wall well over CPU is a step that waited for a core), its tokens and how many
requests got their first token in it (`firsts`: on a decode instance, requests joining with their
pulled KV; elsewhere, finished prefills), the collector's seconds inside it (`gc`), and the gap
since the previous step ended (`gap`: the loop's own work between steps, taking commands and
handing over the outputs, or idling). Unset (the default), nothing is measured or written.
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path
from typing import IO, Any

from llm_engine.outputs import RequestOutput

ENV = "CODEYARD_STEP_TRACE"


class StepTrace:
    """One loop's trace file; `begin` before a step, `end` after it."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(folder / f"steps-{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._gc_s = 0.0
        self._gc_started = 0.0
        self._began = self._wall_began = self._cpu = self._gc_before = 0.0
        self._ended: float | None = None
        gc.callbacks.append(self._on_gc)

    @classmethod
    def from_env(cls) -> StepTrace | None:
        folder = os.environ.get(ENV)
        return cls(Path(folder)) if folder else None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_started

    def begin(self) -> None:
        self._began, self._cpu, self._gc_before = time.perf_counter(), time.thread_time(), self._gc_s
        self._wall_began = time.time()

    def end(self, tokens: int, outputs: list[RequestOutput]) -> None:
        ended = time.perf_counter()
        firsts = sum(1 for o in outputs if o.outputs and len(o.outputs[0].token_ids) == 1)
        gap = None if self._ended is None else self._began - self._ended
        self._file.write(json.dumps({
            "t": round(self._wall_began, 6), "wall": round(ended - self._began, 6),
            "cpu": round(time.thread_time() - self._cpu, 6), "tokens": tokens, "firsts": firsts,
            "gc": round(self._gc_s - self._gc_before, 6), "gap": gap if gap is None else round(gap, 6)}) + "\n")
        self._file.flush()  # a server ends by a signal: a buffered tail would be lost
        self._ended = time.perf_counter()

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._file.close()


def read(path: Path) -> list[dict[str, Any]]:
    """A trace file's steps, in order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
