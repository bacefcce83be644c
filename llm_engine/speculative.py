"""Speculative decoding by n-gram prompt lookup: the config, the proposer and its throttle
(the other method, a draft model, is `draft_model.DraftModelProposer`).

An edit or a completion mostly copies text that is already in the context. The proposer looks
for the latest earlier occurrence of the sequence's last n tokens (longest n first; among equal
n-grams the one whose earlier context agrees longest) and proposes the tokens that followed it;
the engine verifies them in one target forward and keeps the longest accepted run plus one token
of its own. Proposing costs a numpy scan and nothing when there is no match, but a rejected
draft still costs a wider forward. `VerifyCost` measures what each width of step costs against a
one-token step (on the CPU's fused step ~1.15x for 2 tokens, ~1.66x for 6, near 1 where a step
is bound by reading the weights), and each sequence's `SpecThrottle` drafts only as many tokens
as its measured acceptance pays for, apart for short and long matches (a match on one token is
rarely the copy being made, one on three or more usually is): on free text speculation turns
itself down, and it tries again later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_METHODS = ("ngram", "draft_model")
_NGRAM_FIELDS = ("prompt_lookup_max", "prompt_lookup_min")
_MAX_PAUSE = 64  # steps without proposals after repeated unprofitable drafts
_DECAY = 0.8  # weight of a draft in its acceptance estimate after each later one (~5 drafts)


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


_MAX_CONTEXT = 16  # context tokens a match is compared on, backwards, when choosing among matches
MATCH_BUCKETS = 3  # acceptance is tracked apart for matches of 1, 2 and 3+ context tokens


@dataclass(frozen=True)
class NgramMatch:
    """Where the proposal starts (the token after the matched n-gram) and how many tokens before
    the sequence's end agree with the text before it (n, then further back, up to _MAX_CONTEXT)."""

    start: int
    context: int

    @property
    def bucket(self) -> int:
        """Which acceptance estimate this match's draft feeds: on code edits a one-token match's
        first token was accepted ~25% of the time, two tokens' ~40%, three or more ~90%."""
        return min(self.context, MATCH_BUCKETS) - 1


def find_ngram(token_ids: list[int], n_max: int, n_min: int) -> NgramMatch | None:
    """The latest earlier occurrence of the longest of the last n_max..n_min tokens; among those,
    the one whose earlier context agrees longest with the sequence's (the one a copy most likely
    continues).

    Every earlier occurrence of the last token is a candidate, and its agreement (how many tokens,
    backwards, equal the sequence's last ones, up to _MAX_CONTEXT or n_max if longer) comes from
    one comparison of all candidates at once: the longest n-gram's occurrences are those that
    agree longest, so the match is the latest candidate of the longest agreement, if that reaches
    n_min. (It runs before every decode step: scanning for each n, then narrowing by one token at
    a time, took ~0.5 ms of Python and numpy calls a step, ~2% of a speculative step here.)"""
    length = len(token_ids)
    if length < n_min + 1:
        return None
    tokens = np.asarray(token_ids)
    # Candidates end before the last token, so the suffix never matches itself and a match is
    # always followed by at least one token.
    ends = np.flatnonzero(tokens[:length - 1] == tokens[-1])
    if not ends.size:
        return None
    back = np.arange(min(max(_MAX_CONTEXT, n_max), length - 1))
    earlier = ends[:, None] - back  # [candidate, i]: the token i before a candidate's end
    agrees = (earlier >= 0) & (tokens[np.maximum(earlier, 0)] == tokens[length - 1 - back])
    context = np.cumprod(agrees, axis=1).sum(axis=1)  # agreeing tokens up to the first difference
    best = int(context.max())
    if best < n_min:
        return None
    return NgramMatch(int(ends[np.flatnonzero(context == best)[-1]]) + 1, best)


class VerifyCost:
    """What a wider step costs against a one-token step: running means of the engine's
    single-sequence decode steps (whole steps: proposing, the forward pass, sampling) per width.

    The cost is not linear in the width (on the CPU's fused step 8 rows cost ~2.0x one row and 10
    rows ~2.9x: the kernels take rows 8 at a time), so each width keeps its own mean once it has
    been seen a few times; until then a width is priced from the mean cost of a further token
    over all wider steps (`fraction`, `initial` until any was seen).

    `clock` times the steps: where the forward runs on the engine's own thread (the CPU, one
    rank) that is the thread's CPU time, so time other processes take from a shared machine does
    not read as a costly verification (on wall time one slowed wide step raised c enough to turn
    drafting off for the next steps: the benchmark's drafted tokens varied 2x between runs)."""

    def __init__(self, initial: float = 0.3, weight: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter, min_samples: int = 3) -> None:
        self.initial, self.weight, self.clock, self.min_samples = initial, weight, clock, min_samples
        self.step_seconds: float | None = None  # a one-token step
        self.token_seconds: float | None = None  # each further token of a wider step
        self.width_seconds: dict[int, tuple[float, int]] = {}  # width -> (mean step, samples)

    def record(self, tokens: int, seconds: float) -> None:
        if tokens == 1:
            self.step_seconds = self._mean(self.step_seconds, seconds)
            return
        mean, samples = self.width_seconds.get(tokens, (None, 0))
        self.width_seconds[tokens] = (self._mean(mean, seconds), samples + 1)
        if self.step_seconds is not None:
            self.token_seconds = self._mean(self.token_seconds, max(seconds - self.step_seconds, 0.0) / (tokens - 1))

    def _mean(self, mean: float | None, value: float) -> float:
        return value if mean is None else mean + self.weight * (value - mean)

    @property
    def fraction(self) -> float:
        if self.step_seconds is None or self.token_seconds is None:
            return self.initial
        return min(max(self.token_seconds / self.step_seconds, 0.01), 1.0)

    def relative(self, width: int) -> float:
        """A step of `width` tokens over a one-token step (at least 1)."""
        mean, samples = self.width_seconds.get(width, (None, 0))
        if width == 1 or self.step_seconds is None or mean is None or samples < self.min_samples:
            return 1 + self.fraction * (width - 1)
        return max(mean / self.step_seconds, 1.0)


class SpecThrottle:
    """One sequence's draft length from its acceptance and the verification's cost. With a the
    chance that a drafted token is accepted once those before it were (estimated over its recent
    drafts, apart for each kind of match: `NgramMatch.bucket`) a draft of k tokens yields
    1 + a + .. + a^k tokens for a step `cost(k + 1)` times a one-token step: the draft is the k
    that yields the most tokens per cost. When no draft pays (k = 0) that kind of match stops
    proposing for 2, 4, .. 64 of its chances, then tries one token again."""

    def __init__(self, max_tokens: int, buckets: int = MATCH_BUCKETS) -> None:
        self.max_tokens = max_tokens
        self.accepted, self.rejected = [1.5] * buckets, [1.0] * buckets  # decayed counts; the prior: a = 0.6
        self.pause, self.misses = [0] * buckets, [0] * buckets
        self.bucket = 0  # the kind of match the last draft came from

    def acceptance(self, bucket: int = 0) -> float:
        return self.accepted[bucket] / (self.accepted[bucket] + self.rejected[bucket])

    def allowed(self, cost: Callable[[int], float], bucket: int = 0) -> int:
        """Tokens this step may propose (0 while paused); counts a paused chance."""
        self.bucket = bucket
        if self.pause[bucket]:
            self.pause[bucket] -= 1
            return 1 if self.pause[bucket] == 0 else 0  # a probe: one token
        k = best_draft_length(self.acceptance(bucket), cost, self.max_tokens)
        if k == 0:
            self.misses[bucket] += 1
            self.pause[bucket] = min(2 ** self.misses[bucket], _MAX_PAUSE)
        else:
            self.misses[bucket] = 0
        return k

    def record(self, proposed: int, accepted: int) -> None:
        b = self.bucket
        self.accepted[b] = self.accepted[b] * _DECAY + accepted
        self.rejected[b] = self.rejected[b] * _DECAY + (accepted < proposed)


def best_draft_length(acceptance: float, cost: Callable[[int], float], max_tokens: int) -> int:
    """The k in 0..max_tokens with the most expected tokens (1 + a + .. + a^k) per step cost."""
    best_k, best_rate, expected, term = 0, 1.0, 1.0, 1.0
    for k in range(1, max_tokens + 1):
        term *= acceptance
        expected += term
        rate = expected / cost(k + 1)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k
