"""A step's outputs as what changed since the last step (the engine core's messages), and the
cumulative outputs rebuilt from them on the other side (vLLM V1's EngineCoreOutputs).

`LLMEngine.step` returns each changed request's whole cumulative `RequestOutput`: the prompt, its
token ids, every output token and the text so far. Pickled for the socket every step, that was
~26 KB and ~95 us per step of a burst of 12 (two socket writes: the message passed 16 KiB), all on
the core's CPU. `DeltaEncoder` (in the core) sends a request's first output whole and then only the
new token ids, the new text and the metrics' scalars; `DeltaDecoder` (in the API process) appends
them to what it kept. Anything that does not just grow (a beam search's reordered beams, a text the
detokenizer rewrote) goes whole for that field; a request with logprobs or prompt logprobs goes whole
every step (rare, and their entries are dicts of objects).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from llm_engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

log = logging.getLogger("codeyard.llm")


class CompletionDelta(NamedTuple):
    completion_index: int  # CompletionOutput.index
    ids_from: int  # the previous token ids up to here, then `token_ids` (0: these are all of them)
    token_ids: list[int]
    text_from: int  # the previous text up to here, then `text`
    text: str
    cumulative_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None


class OutputDelta(NamedTuple):
    request_id: str
    completions: list[CompletionDelta]
    finished: bool
    # RequestMetrics' scalars, in its field order after arrival_time (which never changes)
    times: tuple[float | None, float | None, float | None, float | None, int, int]
    itl_from: int  # the inter-token latencies kept up to here, then `itl`
    itl: list[float]
    error: str | None
    kv_transfer_params: dict[str, Any] | None


# An output that goes whole (a request's first, or one that does not just grow) as plain values in
# the dataclasses' field order, nested the same way (`_packed`): pickled as classes, a first report
# (RequestOutput, CompletionOutput, RequestMetrics) cost 2.6x more to pickle and 1.8x more to unpickle
# and rebuild with the caches flushed, as they are when a prefill ends (1560 bytes against 605).
PackedOutput = tuple[Any, ...]
StepItem = PackedOutput | OutputDelta


class _Sent(NamedTuple):
    output: RequestOutput  # its completions' lists are the step's own copies, never changed after
    itl_len: int  # the metrics object is the engine's live one: its latencies' length when sent


class DeltaEncoder:
    """The core's side: remembers what each unfinished request's caller has been sent."""

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}

    def encode(self, outputs: list[RequestOutput]) -> list[StepItem]:
        items: list[StepItem] = []
        for output in outputs:
            sent = self._sent.get(output.request_id)
            item: StepItem = (_delta(sent, output) if sent is not None and _deltas_fit(sent.output, output)
                              else _packed(output))
            if output.finished:
                self._sent.pop(output.request_id, None)
            else:
                self._sent[output.request_id] = _Sent(output, len(output.metrics.inter_token_latencies))
            items.append(item)
        return items

    def clear(self) -> None:
        """Every request in flight failed: none of them gets another output."""
        self._sent.clear()

    def __len__(self) -> int:
        return len(self._sent)


class DeltaDecoder:
    """The API process's side: each unfinished request's latest cumulative output."""

    def __init__(self) -> None:
        self._last: dict[str, RequestOutput] = {}

    def decode(self, items: list[StepItem]) -> list[RequestOutput]:
        outputs = []
        for item in items:
            if not isinstance(item, OutputDelta):  # a NamedTuple: this test first
                output = _unpacked(item)
            else:
                last = self._last.get(item.request_id)
                if last is None:  # the two sides disagree: a bug, but one request's, not the server's
                    log.error("LLM: an output delta for unknown request %r dropped", item.request_id)
                    continue
                output = _applied(last, item)
            if output.finished:
                self._last.pop(output.request_id, None)
            else:
                self._last[output.request_id] = output
            outputs.append(output)
        return outputs

    def forget(self, request_id: str | None) -> None:
        """The request failed (None: every request did): no more outputs come for it."""
        if request_id is None:
            self._last.clear()
        else:
            self._last.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._last)


def _deltas_fit(before: RequestOutput, now: RequestOutput) -> bool:
    """Whether `now` can go as a delta on `before`: the same completions, no logprobs of any kind."""
    if now.prompt_logprobs is not None or len(before.outputs) != len(now.outputs):
        return False
    return all(a.index == b.index and b.logprobs is None for a, b in zip(before.outputs, now.outputs))


def _delta(sent: _Sent, output: RequestOutput) -> OutputDelta:
    completions = []
    for before, now in zip(sent.output.outputs, output.outputs):
        ids_from, text_from = len(before.token_ids), len(before.text)
        if now.token_ids[:ids_from] != before.token_ids:
            ids_from = 0
        if not now.text.startswith(before.text):
            text_from = 0
        completions.append(CompletionDelta(now.index, ids_from, now.token_ids[ids_from:], text_from,
                                           now.text[text_from:], now.cumulative_logprob, now.finish_reason,
                                           now.stop_reason))
    m = output.metrics
    itl_from = sent.itl_len if len(m.inter_token_latencies) >= sent.itl_len else 0
    return OutputDelta(output.request_id, completions, output.finished,
                       (m.first_scheduled_time, m.first_token_time, m.last_token_time, m.finished_time,
                        m.num_cached_tokens, m.num_preemptions),
                       itl_from, m.inter_token_latencies[itl_from:], output.error, output.kv_transfer_params)


def _applied(last: RequestOutput, delta: OutputDelta) -> RequestOutput:
    """`last` with `delta` applied: a new output (new lists: a caller may keep the previous one);
    the metrics object is the request's one, updated in place, as the engine's own is."""
    completions = []
    for before, change in zip(last.outputs, delta.completions):
        completions.append(CompletionOutput(
            change.completion_index, before.text[:change.text_from] + change.text,
            before.token_ids[:change.ids_from] + change.token_ids, change.cumulative_logprob, None,
            change.finish_reason, change.stop_reason))
    metrics: RequestMetrics = last.metrics
    (metrics.first_scheduled_time, metrics.first_token_time, metrics.last_token_time, metrics.finished_time,
     metrics.num_cached_tokens, metrics.num_preemptions) = delta.times
    metrics.inter_token_latencies[delta.itl_from:] = delta.itl
    return RequestOutput(last.request_id, last.prompt, last.prompt_token_ids, completions, delta.finished, metrics,
                         delta.error, None, delta.kv_transfer_params)


def _packed(o: RequestOutput) -> PackedOutput:
    m = o.metrics
    return (o.request_id, o.prompt, o.prompt_token_ids,
            [(c.index, c.text, c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason, c.stop_reason)
             for c in o.outputs],
            o.finished,
            (m.arrival_time, m.first_scheduled_time, m.first_token_time, m.last_token_time, m.finished_time,
             m.num_cached_tokens, m.num_preemptions, m.inter_token_latencies),
            o.error, o.prompt_logprobs, o.kv_transfer_params)


def _unpacked(item: PackedOutput) -> RequestOutput:
    request_id, prompt, prompt_token_ids, completions, finished, metrics, error, prompt_logprobs, kv = item
    return RequestOutput(request_id, prompt, prompt_token_ids, [CompletionOutput(*c) for c in completions], finished,
                         RequestMetrics(*metrics), error, prompt_logprobs, kv)
