"""Per-request sampling parameters, validated on construction (ValueError names the field)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_engine.structured_outputs import StructuredOutputsParams

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """What to sample and when to stop, in vLLM's vocabulary.

    temperature == 0 means greedy. top_k <= 0 (or -1) disables top-k. `timeout` is seconds from
    arrival after which the request is aborted. `logprobs` / `prompt_logprobs`: how many top
    alternatives to return next to each sampled / prompt token's own logprob (0: just its own).
    `structured_outputs` constrains the output to a JSON schema, regex, choice or grammar.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    timeout: float | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # Disaggregated serving (vLLM's field): {"do_remote_decode": true} asks a prefill instance to
    # keep the prompt's KV; a prefill instance's answer makes a decode instance pull it.
    kv_transfer_params: dict[str, Any] | None = None
    stop_list: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name}: {rule}, got {getattr(self, name)!r}")

        def is_int(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_num(value: object) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        check(is_int(self.n) and self.n >= 1, "n", "must be an integer >= 1")
        check(is_num(self.temperature) and self.temperature >= 0, "temperature", "must be >= 0")
        check(is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        check(is_int(self.top_k) and (self.top_k >= 0 or self.top_k == -1), "top_k",
              "must be -1, 0 (disabled) or a positive integer")
        check(is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        check(is_num(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty",
              "must be > 0")
        check(is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2, "presence_penalty",
              "must be in [-2, 2]")
        check(is_num(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
              "frequency_penalty", "must be in [-2, 2]")
        check(self.seed is None or is_int(self.seed), "seed", "must be an integer or None")
        check(self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1),
              "max_tokens", "must be an integer >= 1 or None")
        check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None:
            check(self.min_tokens <= self.max_tokens, "min_tokens", "must not exceed max_tokens")
        check(self.logprobs is None or (is_int(self.logprobs) and self.logprobs >= 0), "logprobs",
              "must be an integer >= 0 or None")
        check(self.prompt_logprobs is None or (is_int(self.prompt_logprobs) and self.prompt_logprobs >= 0),
              "prompt_logprobs", "must be an integer >= 0 or None")
        check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
              "structured_outputs", "must be a StructuredOutputsParams or None")
        check(self.timeout is None or (is_num(self.timeout) and self.timeout > 0), "timeout",
              "must be a positive number of seconds or None")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        check(all(isinstance(s, str) and s for s in stops), "stop", "must be non-empty strings")
        self.stop_list = stops
        ids = self.stop_token_ids or []
        check(all(is_int(t) and t >= 0 for t in ids), "stop_token_ids", "must be non-negative integers")
        self.stop_token_ids = list(ids)
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
