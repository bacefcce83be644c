"""Triton Inference Server's per-model metrics (`nv_inference_*`) for /v2 REST and gRPC requests.

They are served on the same /metrics as the `vllm:*` ones, with Triton's names, types and labels
(`model`, `version`; `reason` on failures), so Triton dashboards and alerts work unchanged. They are
written out here rather than kept in prometheus_client counters, which would rename every counter
to `*_total`. A request's time is split at the engine's own timestamps: compute_input until its rows
reach the engine (tensors decoded, prompts tokenized), queue until the first row is scheduled,
compute_infer until the last row finishes, compute_output after that (output tensors built). As in
Triton, inference and execution counts and durations are added for successful requests only, so a
duration divided by nv_inference_request_success is a mean. A request counts as pending until the
engine has scheduled each of its rows.

Counts are plain integers: every update runs on the server's one event loop (HTTP and gRPC share
it), so the hot path pays a few additions and no lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.outputs import RequestMetrics

VERSION = "1"
# Triton's failure reasons: refused by admission (queue full, not loaded), cancelled by the
# client, failed in the backend (the engine), anything else (bad input).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_COUNTERS = (  # attribute, Triton's name, help
    ("success", "nv_inference_request_success",
     "Number of successful inference requests, all batch sizes"),
    ("inferences", "nv_inference_count", "Number of inferences performed (a batch of n counts n)"),
    ("executions", "nv_inference_exec_count", "Number of model executions performed"),
    ("request_us", "nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds"),
    ("queue_us", "nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    ("compute_input_us", "nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds"),
    ("compute_infer_us", "nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds"),
    ("compute_output_us", "nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds"),
)


@dataclass
class ModelStats:
    """One model's counts since the server started."""

    success: int = 0
    failure: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    inferences: int = 0
    executions: int = 0
    request_us: int = 0
    queue_us: int = 0
    compute_input_us: int = 0
    compute_infer_us: int = 0
    compute_output_us: int = 0
    pending: int = 0


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class TritonMetrics:
    """The nv_inference_* metrics of the served models (the LLM and its ensembles)."""

    def __init__(self, models: Iterable[str]) -> None:
        self.models = {name: ModelStats() for name in models}  # fixed: every name exported from the start

    def request(self, model: str, arrived: float | None = None) -> RequestStats:
        """Start counting a request to `model` (one of `models`), received at `arrived` (time.time())."""
        return RequestStats(self.models[model], time.time() if arrived is None else arrived)

    def render(self) -> bytes:
        """The metrics in Prometheus' text format, as Triton writes them."""
        models = [(_label(name), stats) for name, stats in self.models.items()]
        lines: list[str] = []

        def family(name: str, kind: str, doc: str) -> None:
            lines.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}"))

        family("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")
        for model, stats in models:  # labels in name order, as Triton writes them
            lines.extend(f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="{VERSION}"}} '
                         f'{count}' for reason, count in stats.failure.items())
        for attribute, name, doc in _COUNTERS:
            family(name, "counter", doc)
            lines.extend(f'{name}{{model="{model}",version="{VERSION}"}} {getattr(stats, attribute)}'
                         for model, stats in models)
        family("nv_inference_pending_request_count", "gauge",
               "Instantaneous number of pending requests awaiting execution per-model.")
        lines.extend(f'nv_inference_pending_request_count{{model="{model}",version="{VERSION}"}} {stats.pending}'
                     for model, stats in models)
        return ("\n".join(lines) + "\n").encode()


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELED"
    status = exc.status if isinstance(exc, OpenAIError) else 400 if isinstance(exc, ValueError) else 500
    if status in (429, 503):
        return "REJECTED"
    return "BACKEND" if status >= 500 else "OTHER"


class RequestStats:
    """One request from its arrival to its last answer; counted once, as a success or a failure.

    Used as a context manager it counts a success on a normal exit and a failure (with its reason)
    on an exception; `failed` counts an error answered in-band (a stream's error message)."""

    def __init__(self, stats: ModelStats, arrived: float) -> None:
        self.stats = stats
        self.arrived = arrived
        self.rows = 0
        self.scheduled_rows: set[int] = set()
        self.pending = True
        self.done = False
        self.engine_arrival: float | None = None  # earliest row: reached the engine
        self.scheduled: float | None = None  # earliest row: first scheduled
        self.finished: float | None = None  # latest row: finished
        stats.pending += 1

    def admitted(self, rows: int) -> None:
        """The engine has taken the request's `rows` (into its queue)."""
        self.rows = rows

    def row_output(self, row: int, metrics: RequestMetrics, finished: bool) -> None:
        """A row's new output: it ends the wait once every row is scheduled, its timestamps once done."""
        if self.pending and metrics.first_scheduled_time is not None:
            self.scheduled_rows.add(row)
            if len(self.scheduled_rows) >= self.rows:
                self._not_pending()
        if finished:
            self._row_finished(metrics)

    def _row_finished(self, metrics: RequestMetrics) -> None:
        arrival, scheduled, finished = metrics.arrival_time, metrics.first_scheduled_time, metrics.finished_time
        self.engine_arrival = arrival if self.engine_arrival is None else min(self.engine_arrival, arrival)
        if scheduled is not None:
            self.scheduled = scheduled if self.scheduled is None else min(self.scheduled, scheduled)
        if finished is not None:
            self.finished = finished if self.finished is None else max(self.finished, finished)

    def succeeded(self) -> None:
        if self.done:
            return
        self._end()
        now = time.time()
        reached = self.engine_arrival if self.engine_arrival is not None else now
        scheduled = self.scheduled if self.scheduled is not None else reached
        finished = self.finished if self.finished is not None else now
        s = self.stats
        s.success += 1
        s.inferences += self.rows
        s.executions += 1
        s.request_us += _us(now - self.arrived)
        s.compute_input_us += _us(reached - self.arrived)
        s.queue_us += _us(scheduled - reached)
        s.compute_infer_us += _us(finished - scheduled)
        s.compute_output_us += _us(now - finished)

    def failed(self, exc: BaseException) -> None:
        if self.done:
            return
        self._end()
        self.stats.failure[failure_reason(exc)] += 1

    def __enter__(self) -> RequestStats:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.succeeded()
        else:
            self.failed(exc)

    def __del__(self) -> None:  # dropped with no outcome (a stream that never started): the client left
        if not self.done:
            self.failed(asyncio.CancelledError())

    def _end(self) -> None:
        self.done = True
        self._not_pending()

    def _not_pending(self) -> None:
        if self.pending:
            self.pending = False
            self.stats.pending -= 1


def _us(seconds: float) -> int:
    return max(0, round(seconds * 1e6))
