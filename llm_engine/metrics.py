"""Prometheus metrics with the names vLLM users already chart (`vllm:*`), per app registry.

`EngineMetrics.on_step` is the AsyncLLMEngine step callback: gauges come from the engine's stats
snapshot, counters advance by the snapshot's change since the previous step, and finished
requests feed the latency histograms. Each server app owns a CollectorRegistry, so several apps
in one process (tests) don't clash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llm_engine.outputs import RequestOutput

if TYPE_CHECKING:
    from llm_engine.llm_engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_COUNTED = {  # EngineStats field -> counter attribute
    "prefix_cache_queries": "prefix_queries",
    "prefix_cache_hits": "prefix_hits",
    "mm_cache_queries": "mm_queries",
    "mm_cache_hits": "mm_hits",
    "num_preemptions": "preemptions",
    "prompt_tokens_total": "prompt_tokens",
    "generation_tokens_total": "generation_tokens",
    "spec_decode_num_drafts": "spec_drafts",
    "spec_decode_num_draft_tokens": "spec_draft_tokens",
    "spec_decode_num_accepted_tokens": "spec_accepted_tokens",
}


class EngineMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.mm_queries = counter("vllm:mm_cache_queries", "Images looked up in the encoder-output cache.")
        self.mm_hits = counter("vllm:mm_cache_hits", "Images whose features were cached (encoder skipped).")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted for lack of KV blocks.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Speculative drafts verified.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position in the draft.",
                                             labels + ["position"], registry=r)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=r)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.")
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.")
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "First scheduled to first token.")
        self.decode_time = histogram("vllm:request_decode_time_seconds", "First token to last token.")
        self.inference_time = histogram("vllm:request_inference_time_seconds", "First scheduled to last token.")
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Tokens processed per engine step.",
                                          buckets=_TOKEN_BUCKETS)
        self.model_name = model_name
        for metric in (self.running, self.waiting, self.kv_usage, self.prefix_queries, self.prefix_hits,
                       self.preemptions, self.prompt_tokens, self.generation_tokens, self.spec_drafts,
                       self.spec_draft_tokens, self.spec_accepted_tokens, self.ttft, self.itl,
                       self.e2e, self.queue_time, self.prefill_time, self.decode_time, self.inference_time,
                       self.iteration_tokens):
            metric.labels(model_name)  # export zeros from the start, so every name exists
        self._previous: dict[str, int] = {field: 0 for field in _COUNTED}
        self.sections: list[Callable[[], bytes]] = []  # more text for the same /metrics (Triton's names)
        self._previous_per_pos: list[int] = []

    def on_step(self, stats: EngineStats, outputs: list[RequestOutput]) -> None:
        name = self.model_name
        self.running.labels(name).set(stats.num_running)
        self.waiting.labels(name).set(stats.num_waiting)
        self.kv_usage.labels(name).set(stats.kv_cache_usage)
        for field, attr in _COUNTED.items():
            value = getattr(stats, field)
            if value > self._previous[field]:
                getattr(self, attr).labels(name).inc(value - self._previous[field])
            self._previous[field] = value
        per_pos = stats.spec_decode_num_accepted_tokens_per_pos
        previous = self._previous_per_pos + [0] * (len(per_pos) - len(self._previous_per_pos))
        for position, (value, before) in enumerate(zip(per_pos, previous)):
            if value > before:
                self.spec_accepted_per_pos.labels(name, str(position)).inc(value - before)
        self._previous_per_pos = list(per_pos)
        if stats.last_iteration_tokens:
            self.iteration_tokens.labels(name).observe(stats.last_iteration_tokens)
        for output in outputs:
            if output.finished:
                self._observe_finished(output)

    def _observe_finished(self, output: RequestOutput) -> None:
        name, m = self.model_name, output.metrics
        for completion in output.outputs:
            self.success.labels(name, completion.finish_reason or "abort").inc()
        if m.ttft is not None:
            self.ttft.labels(name).observe(m.ttft)
        if m.time_in_queue is not None:
            self.queue_time.labels(name).observe(m.time_in_queue)
        scheduled, first, last = m.first_scheduled_time, m.first_token_time, m.last_token_time
        if scheduled is not None and first is not None and last is not None:  # vLLM's split of its time in the engine
            self.prefill_time.labels(name).observe(first - scheduled)
            self.decode_time.labels(name).observe(last - first)
            self.inference_time.labels(name).observe(last - scheduled)
        if m.finished_time is not None:
            self.e2e.labels(name).observe(m.finished_time - m.arrival_time)
        for gap in m.inter_token_latencies:
            self.itl.labels(name).observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry) + b"".join(section() for section in self.sections)
