"""Beam search in vLLM's shape: `LLM.beam_search(prompts, BeamSearchParams(...))`.

Each step every live beam yields its top 2 * beam_width next-token logprobs; the best beam_width
candidates by cumulative logprob go on, and a candidate ending in EOS is finished if it ranks
among the best beam_width (as in Transformers). Final order is Transformers':
cum_logprob / generated_length ** length_penalty.

`BeamGroup` is a beam-search request inside the engine (its beams are sequences that fork each
other's block tables copy-on-write, see beam_steps.py): `LLM.beam_search`, `LLMEngine.add_request`
and the completions endpoint's `use_beam_search` (through the async engine or the engine-core
process) all run one. The previous design, beams run on top of the engine as one-token requests,
is kept only as the beam benchmark's baseline (benchmarks/suites/beam.py), with this ranking.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

