"""Beam search in vLLM's shape: `LLM.beam_search(prompts, BeamSearchParams(...))`.

Like vLLM's offline beam search, each step asks the engine for one more token of every live beam
with its top 2 * beam_width logprobs, as ordinary requests in one continuous batch; beams share
their history's KV through the prefix cache (a beam's step recomputes only its last, partial
block). The best beam_width candidates by cumulative logprob go on; a candidate ending in EOS is
finished. Final order is Transformers': cum_logprob / generated_length ** length_penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_engine.outputs import Logprob
from llm_engine.sampling_params import SamplingParams


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"beam_width: must be an integer >= 1, got {self.beam_width!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature != 0.0:
            raise ValueError("temperature: beam search here is deterministic (0.0 only)")


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` are the prompt's and the generated ones (as vLLM), `text` decodes them."""

    tokens: list[int]
    cum_logprob: float
    num_prompt_tokens: int
    text: str | None = None
    finish_reason: str | None = None

    @property
    def output_tokens(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]

    def score(self, length_penalty: float) -> float:
        return self.cum_logprob / float(max(len(self.output_tokens), 1) ** length_penalty)


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence] = field(default_factory=list)  # best first


class BeamSearch:
    """The beams of one prompt: what to extend next and, at the end, the ranking."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, eos_token_ids: set[int]) -> None:
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.live = [BeamSearchSequence(list(prompt_ids), 0.0, len(prompt_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0
        # One more token of a beam, with the logprobs of its 2 x beam_width likeliest tokens.
        self.step_params = SamplingParams(temperature=0, max_tokens=1, logprobs=2 * params.beam_width,
                                          ignore_eos=True)

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.params.max_tokens

    def advance(self, tops: list[dict[int, Logprob]]) -> None:
        """Extend the live beams, given each one's next-token logprobs (in the order of `live`)."""
        width = self.params.beam_width
        candidates = []
        for beam, top in zip(self.live, tops):
            best = sorted(top.items(), key=lambda item: item[1].logprob, reverse=True)[:2 * width]
            for token, logprob in best:
                ended = not self.params.ignore_eos and token in self.eos_token_ids
                candidates.append(BeamSearchSequence(beam.tokens + [token], beam.cum_logprob + logprob.logprob,
                                                     beam.num_prompt_tokens, finish_reason="stop" if ended else None))
        candidates.sort(key=lambda b: b.cum_logprob, reverse=True)
        self.live = []
        for rank, candidate in enumerate(candidates):
            if candidate.finish_reason is not None:
                if rank < width:  # an ended beam counts if it ranks among the best, as in Transformers
                    self.finished.append(candidate)
            elif len(self.live) < width:
                self.live.append(candidate)
        self.steps += 1

    def result(self, tokenizer: Any) -> BeamSearchOutput:
        for beam in self.live:
            beam.finish_reason = "length"
        ranked = sorted(self.finished + self.live, key=lambda b: b.score(self.params.length_penalty),
                        reverse=True)[:self.params.beam_width]
        for beam in ranked:
            beam.text = tokenizer.decode(beam.tokens) if tokenizer is not None else None
        return BeamSearchOutput(ranked)
