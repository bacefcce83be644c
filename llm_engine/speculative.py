"""Speculative decoding by n-gram prompt lookup: the config, the proposer and its throttle
(the other method, a draft model, is `draft_model.DraftModelProposer`).

An edit or a completion mostly copies text that is already in the context. The proposer looks
for the latest earlier occurrence of the sequence's last n tokens (longest n first) and proposes
the k tokens that followed it; the engine verifies them in one target forward and keeps the
longest accepted run plus one token of its own. Proposing costs a numpy scan and nothing when
there is no match, but a rejected draft still costs a wider forward, so each sequence's
`SpecThrottle` shortens its drafts after rejections and pauses proposing (doubling pauses) while
nothing is accepted: on free text speculation turns itself down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_METHODS = ("ngram", "draft_model")
_NGRAM_FIELDS = ("prompt_lookup_max", "prompt_lookup_min")
_MAX_PAUSE = 64  # steps without proposals after repeated fully rejected drafts


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
    def from_dict(cls, value: dict | SpeculativeConfig) -> SpeculativeConfig:
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
            return tokens[start:start + k].tolist()
    return []


class SpecThrottle:
    """One sequence's draft length: grows while drafts are accepted, shrinks to what was accepted
    after a rejection, and pauses proposing for 2, 4, .. 64 steps after drafts fully rejected."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.num_tokens = max_tokens
        self.pause = 0
        self.misses = 0

    def allowed(self) -> int:
        """Tokens this step may propose (0 while paused); counts a paused step."""
        if self.pause:
            self.pause -= 1
            return 0
        return self.num_tokens

    def record(self, proposed: int, accepted: int) -> None:
        if accepted == proposed:
            self.num_tokens = min(self.max_tokens, self.num_tokens * 2)
        else:
            self.num_tokens = max(1, accepted + 1)
        if accepted:
            self.misses = 0
        else:
            self.misses += 1
            self.pause = min(2 ** self.misses, _MAX_PAUSE)
