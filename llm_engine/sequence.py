"""Requests and their sequences, with a validated lifecycle state machine.

A Request holds one prompt and `n` Sequences (samples). Sequence 0 prefills the prompt; the other
samples are forked from it once the prompt is computed and share its KV blocks.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import Any

import torch

from llm_engine.beam_search import BeamGroup
from llm_engine.multimodal.inputs import ImageItem, block_extra_keys
from llm_engine.outputs import Logprob, RequestMetrics
from llm_engine.sampling_params import SamplingParams
from llm_engine.speculative import SpecThrottle
from llm_engine.structured_outputs import Grammar, GrammarState

BlockKey = tuple[int | tuple[str, int], ...]  # a full block's token ids, then (image hash, offset) of its images


class InvalidTransition(RuntimeError):
    """A lifecycle change that the state machine does not allow."""


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_IGNORED = "finished_ignored"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "length",
    SequenceStatus.FINISHED_ERROR: "error",
}
_TERMINAL = set(_FINISH_REASONS)
_ALLOWED: dict[SequenceStatus, set[SequenceStatus]] = {
    SequenceStatus.WAITING: {SequenceStatus.RUNNING, SequenceStatus.FINISHED_ABORTED,
                             SequenceStatus.FINISHED_IGNORED, SequenceStatus.FINISHED_ERROR},
    SequenceStatus.RUNNING: {SequenceStatus.PREEMPTED} | _TERMINAL,
    SequenceStatus.PREEMPTED: {SequenceStatus.RUNNING, SequenceStatus.FINISHED_ABORTED,
                               SequenceStatus.FINISHED_IGNORED, SequenceStatus.FINISHED_ERROR},
}

_seq_counter = itertools.count()


class Sequence:
    """One sample: its tokens, how many of them have KV in the cache, and its block table."""

    def __init__(self, request: Request, index: int, token_ids: list[int]) -> None:
        self.seq_id = next(_seq_counter)
        self.request = request
        self.index = index
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full computed blocks
        self.status = SequenceStatus.WAITING
        self.stop_reason: int | str | None = None
        self.cumulative_logprob = 0.0
        self.logprobs: list[dict[int, Logprob]] = []
        self.text = ""
        self.detokenizer_state: object | None = None
        self.spec_token_ids: list[int] = []  # this step's draft tokens, verified after the forward
        self.spec_throttle: SpecThrottle | None = None  # its SpecThrottle under speculative decoding
        # A beam's likeliest next tokens [(token, logprob)], kept until every beam of its group has its own.
        self.beam_top: list[tuple[int, float]] | None = None
        # Where this sample is in its request's grammar (each sample walks its own).
        self.grammar: GrammarState | None = request.grammar.new_state() if request.grammar else None
        self.generator: torch.Generator | None = None
        seed = request.params.seed
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed + index)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def step_token_ids(self) -> list[int]:
        """The tokens a forward pass reads: the sequence's own, then any draft being verified."""
        return self.token_ids + self.spec_token_ids if self.spec_token_ids else self.token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def sort_key(self) -> tuple[int, float, int, int]:
        return (self.request.priority_key, self.request.arrival_time, self.request.order, self.index)

    def block_key(self, index: int, block_size: int) -> BlockKey:
        """What a full block's KV depends on besides the blocks before it: its token ids and,
        for image placeholders, which image (so the same text with another image never matches)."""
        start, end = index * block_size, (index + 1) * block_size
        tokens = tuple(self.token_ids[start:end])
        images = self.request.images
        return tokens + block_extra_keys(images, start, end) if images else tokens

    def set_status(self, status: SequenceStatus) -> None:
        if status not in _ALLOWED.get(self.status, set()):
            raise InvalidTransition(f"sequence {self.seq_id}: {self.status.name} -> {status.name} is not allowed")
        self.status = status

    def fork(self, index: int) -> Sequence:
        """A new sample sharing everything computed so far (blocks are shared by the block manager)."""
        child = Sequence(self.request, index, self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.status = SequenceStatus.RUNNING
        return child


_request_counter = itertools.count()


class Request:
    """A prompt with its sampling parameters, priority, timing and its n sequences."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, priority: int = 0, arrival_time: float | None = None,
                 use_priority: bool = False, images: list[ImageItem] | None = None,
                 grammar: Grammar | None = None, beam: BeamGroup | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.images = images or []  # image placeholders in the prompt, in order
        self.params = params
        self.grammar = grammar  # the compiled structured_outputs constraint
        self.beam = beam  # a beam-search request: its sequences are the live beams
        self.priority = priority
        self.priority_key = priority if use_priority else 0
        self.order = next(_request_counter)
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.error: str | None = None
        self.kv_transfer_params: dict[str, Any] | None = None  # a prefill instance's handle to the KV it keeps
        self.seqs: list[Sequence] = [Sequence(self, 0, self.prompt_token_ids)]
        # Entry i is prompt token i's logprob (the first token has none); filled as prefill goes.
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = [None] if params.prompt_logprobs is not None else None

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs still missing: the prompt must be computed, not read from the cache."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def deadline(self) -> float | None:
        if self.params.timeout is None:
            return None
        return self.arrival_time + self.params.timeout

    @property
    def is_finished(self) -> bool:
        if self.beam is not None:  # its live beams (none once every beam ended with EOS)
            return all(s.is_finished for s in self.seqs)
        # Samples 1..n-1 are forked when sample 0 emits its first token; a request that ends
        # before that (abort, ignored, error) never gets them.
        forked_all = len(self.seqs) == self.params.n or self.seqs[0].num_output_tokens == 0
        return forked_all and all(s.is_finished for s in self.seqs)
