"""Beam search in vLLM's shape: `LLM.beam_search(prompts, BeamSearchParams(...))`.

Like vLLM's offline beam search, each step asks the engine for one more token of every live beam
with its top 2 * beam_width logprobs, as ordinary requests in one continuous batch; beams share
their history's KV through the prefix cache (a beam's step recomputes only its last, partial
block). The best beam_width candidates by cumulative logprob go on; a candidate ending in EOS is
finished. Final order is Transformers': cum_logprob / generated_length ** length_penalty.
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


def expand(beam: BeamSearchSequence, top: dict[int, float], eos_token_ids: set[int],
           ignore_eos: bool) -> list[BeamSearchSequence]:
    """The beam's candidates for its next token (`top`: token -> logprob)."""
    out = []
    for token, logprob in top.items():
        done = not ignore_eos and token in eos_token_ids
        out.append(BeamSearchSequence(beam.tokens + [token], beam.cum_logprob + logprob, beam.num_prompt_tokens,
                                      finish_reason="stop" if done else None))
    return out
