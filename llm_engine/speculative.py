"""Speculative decoding by n-gram prompt lookup: the config, the proposer and its throttle
(the other method, a draft model, is `draft_model.DraftModelProposer`).

An edit or a completion mostly copies text that is already in the context. The proposer looks
for the latest earlier occurrence of the sequence's last n tokens (longest n first) and proposes
the k tokens that followed it; the engine verifies them in one target forward and keeps the
longest accepted run plus one token of its own. Proposing costs a numpy scan and nothing when
there is no match, but a rejected draft still costs a wider forward. `VerifyCost` measures what
one more token in a step costs (a fraction of a one-token step: ~0.25 on the CPU's fused
step, near 0 where a step is bound by reading the weights), and each sequence's `SpecThrottle`
drafts only as many tokens as its measured acceptance pays for: on free text speculation turns
itself down, and it tries again later.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_METHODS = ("ngram", "draft_model")
_NGRAM_FIELDS = ("prompt_lookup_max", "prompt_lookup_min")
_MAX_PAUSE = 64  # steps without proposals after repeated unprofitable drafts
_DECAY = 0.7  # weight of a draft in the acceptance estimate after each later one (~3 drafts)


@dataclass
class SpeculativeConfig:
    """vLLM's `speculative_config`: "ngram" (prompt lookup) or "draft_model" (`model`: a local
    folder or .gguf of a smaller model sharing the target's vocabulary)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in _METHODS:
            raise ValueError(f"speculative_config.method: must be one of {_METHODS}, got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config.{name}: must be a positive integer, got {value!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"speculative_config.model: must be a path, got {self.model!r}")
        if (self.method == "draft_model") != bool(self.model):
            raise ValueError("speculative_config.model: required for method 'draft_model' (a local folder "
                             "or .gguf), and only for it")
        if self.model and not Path(self.model).exists():
            raise ValueError(f"speculative_config.model: path {self.model!r} does not exist "
                             "(only local models are loaded)")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculative_config.prompt_lookup_min: must not exceed prompt_lookup_max")

    @classmethod
    def from_dict(cls, value: dict[str, Any] | SpeculativeConfig) -> SpeculativeConfig:
        if isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config: expected a dict, got {type(value).__name__}")
        known = {"method", "num_speculative_tokens", "model", *_NGRAM_FIELDS}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown field(s) {unknown}; known: {sorted(known)}")
        if "method" not in value and value.get("model"):  # as vLLM: a model means a draft model
            value = {**value, "method": "draft_model"}
        if value.get("method") == "draft_model" and set(value) & set(_NGRAM_FIELDS):
            raise ValueError(f"speculative_config: {sorted(set(value) & set(_NGRAM_FIELDS))} only apply to "
                             "method 'ngram'")
        return cls(**value)


def propose_ngram(token_ids: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens (n_max..n_min)."""
    length = len(token_ids)
    if length < n_min + 1:
        return []
    tokens = np.asarray(token_ids)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        # Windows end before the last token, so the suffix never matches itself and a match is
        # always followed by at least one token.
        windows = sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            proposal: list[int] = tokens[start:start + k].tolist()
            return proposal
    return []


class VerifyCost:
    """What one more token in a sequence's step costs, as a fraction of a one-token step: running
    means of the engine's single-sequence decode steps (whole steps: proposing, the forward pass,
    sampling), one-token steps against wider ones.

    `clock` times the steps: where the forward runs on the engine's own thread (the CPU, one
    rank) that is the thread's CPU time, so time other processes take from a shared machine does
    not read as a costly verification (on wall time one slowed wide step raised c enough to turn
    drafting off for the next steps: the benchmark's drafted tokens varied 2x between runs)."""

    def __init__(self, initial: float = 0.3, weight: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.initial, self.weight, self.clock = initial, weight, clock
        self.step_seconds: float | None = None  # a one-token step
        self.token_seconds: float | None = None  # each further token of a wider step

    def record(self, tokens: int, seconds: float) -> None:
        if tokens == 1:
            self.step_seconds = self._mean(self.step_seconds, seconds)
        elif self.step_seconds is not None:
            self.token_seconds = self._mean(self.token_seconds, max(seconds - self.step_seconds, 0.0) / (tokens - 1))

    def _mean(self, mean: float | None, value: float) -> float:
        return value if mean is None else mean + self.weight * (value - mean)

    @property
    def fraction(self) -> float:
        if self.step_seconds is None or self.token_seconds is None:
            return self.initial
        return min(max(self.token_seconds / self.step_seconds, 0.01), 1.0)


class SpecThrottle:
    """One sequence's draft length from its acceptance. With a the chance that a drafted token is
    accepted once those before it were (estimated over its recent drafts) and c the cost of a
    token more in a step (`VerifyCost.fraction`), a draft's i-th token adds a^i expected tokens
    for c: the draft is as long as a^k > c. When even one token does not pay (a <= c) the sequence
    stops proposing for 2, 4, .. 64 steps, then tries one token again."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.accepted, self.rejected = 1.5, 1.0  # decayed counts; the prior: a = 0.6
        self.pause = 0
        self.misses = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def allowed(self, cost: float) -> int:
        """Tokens this step may propose (0 while paused); counts a paused step."""
        if self.pause:
            self.pause -= 1
            return 1 if self.pause == 0 else 0  # a probe: one token
        a = self.acceptance
        k = 0 if a <= cost else self.max_tokens if a >= 1 else int(math.log(cost) / math.log(a))
        k = min(k, self.max_tokens)
        if k == 0:
            self.misses += 1
            self.pause = min(2 ** self.misses, _MAX_PAUSE)
        else:
            self.misses = 0
        return k

    def record(self, proposed: int, accepted: int) -> None:
        self.accepted = self.accepted * _DECAY + accepted
        self.rejected = self.rejected * _DECAY + (accepted < proposed)
