"""Beam search in vLLM's shape: `LLM.beam_search(prompts, BeamSearchParams(...))`.

Each step every live beam yields its top 2 * beam_width next-token logprobs; the best beam_width
candidates by cumulative logprob go on, and a candidate ending in EOS is finished if it ranks
among the best beam_width (as in Transformers). Final order is Transformers':
cum_logprob / generated_length ** length_penalty.

Two drivers share that ranking (`rank_candidates`): `BeamGroup` is a beam-search request inside
the engine (its beams are sequences that fork each other's block tables copy-on-write, see
beam_steps.py), and `BeamSearch` runs beams on top of an engine as one-token requests (the
completions endpoint over the async engine).
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


@dataclass
class Candidate:
    """One more token of beam `parent` (its index among the live beams)."""

    parent: int
    token: int
    cum_logprob: float
    ended: bool  # the token is an EOS (and EOS ends beams)


def rank_candidates(beams: list[tuple[float, list[tuple[int, float]]]], params: BeamSearchParams,
                    eos_token_ids: set[int]) -> tuple[list[Candidate], list[Candidate]]:
    """Given each live beam's (cumulative logprob, [(token, logprob)] of its likeliest next tokens),
    the beams that go on (best first, at most beam_width) and the candidates that end here."""
    width = params.beam_width
    candidates = []
    for parent, (cum_logprob, top) in enumerate(beams):
        for token, logprob in sorted(top, key=lambda item: item[1], reverse=True)[:2 * width]:
            is_eos = not params.ignore_eos and token in eos_token_ids
            candidates.append(Candidate(parent, token, cum_logprob + logprob, is_eos))
    candidates.sort(key=lambda c: c.cum_logprob, reverse=True)
    live: list[Candidate] = []
    ended: list[Candidate] = []
    for rank, candidate in enumerate(candidates):
        if candidate.ended:
            if rank < width:  # an ended beam counts if it ranks among the best, as in Transformers
                ended.append(candidate)
        elif len(live) < width:
            live.append(candidate)
    return live, ended


def final_ranking(beams: list[BeamSearchSequence], params: BeamSearchParams) -> list[BeamSearchSequence]:
    """The beam_width best of the finished and live beams, by Transformers' length-penalised score."""
    return sorted(beams, key=lambda b: b.score(params.length_penalty), reverse=True)[:params.beam_width]


class BeamGroup:
    """A beam-search request inside the engine: its parameters, the steps taken and the beams that
    ended with EOS (the live ones are the request's sequences)."""

    def __init__(self, params: BeamSearchParams, eos_token_ids: set[int]) -> None:
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0
        self.next_index = 1  # of the next forked beam (sequence 0 prefills the prompt)

    @property
    def top_n(self) -> int:
        return 2 * self.params.beam_width


class BeamSearch:
    """The beams of one prompt run on top of an engine: what to extend next and, at the end, the ranking."""

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
        live, ended = rank_candidates([(beam.cum_logprob, [(t, lp.logprob) for t, lp in top.items()])
                                       for beam, top in zip(self.live, tops)], self.params, self.eos_token_ids)

        def extend(c: Candidate, reason: str | None) -> BeamSearchSequence:
            parent = self.live[c.parent]
            return BeamSearchSequence(parent.tokens + [c.token], c.cum_logprob, parent.num_prompt_tokens,
                                      finish_reason=reason)

        self.finished.extend(extend(c, "stop") for c in ended)
        self.live = [extend(c, None) for c in live]
        self.steps += 1

    def result(self, tokenizer: Any) -> BeamSearchOutput:
        for beam in self.live:
            beam.finish_reason = "length"
        ranked = final_ranking(self.finished + self.live, self.params)
        for beam in ranked:
            beam.text = tokenizer.decode(beam.tokens) if tokenizer is not None else None
        return BeamSearchOutput(ranked)
