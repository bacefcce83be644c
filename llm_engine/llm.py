"""LLM: the offline facade — build an engine, generate for a list of prompts with a progress bar."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, cast

from tqdm import tqdm

from llm_engine.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from llm_engine.config import EngineConfig
from llm_engine.llm_engine import LLMEngine
from llm_engine.loader.engine_manifest import tuned_options
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams
from llm_engine.tokenizer import Tokenizer

# text, token ids, or {"prompt"/"prompt_token_ids": ..., "multi_modal_data": {"image": [...]}}
Prompt = str | list[int] | dict[str, Any]


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        # a built engine's measured options (`llm build --tune`) unless the caller gives its own
        self.engine = LLMEngine(EngineConfig(model=model, **{**tuned_options(model), **kwargs}))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts."""
        one = isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        prompts = cast(list[Prompt], [prompts] if one else list(prompts))
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"priority: got {len(priorities)} values for {len(prompts)} prompts")
        return self._run(list(zip(prompts, params, priorities)), use_tqdm)

    def _run(self, requests: list[tuple[Prompt, SamplingParams | BeamSearchParams, int]],
             use_tqdm: bool) -> list[RequestOutput]:
        """Add the requests, step the engine until all are finished (abort them on any error)."""
        ids = [f"gen-{next(self._ids)}" for _ in requests]
        try:
            for rid, (prompt, p, prio) in zip(ids, requests):
                self.engine.add_request(rid, prompt, p, priority=prio)
            finished: dict[str, RequestOutput] = {}
            with tqdm(total=len(ids), desc="Generating", unit="req", disable=not use_tqdm) as bar:
                while len(finished) < len(ids):
                    for output in self.engine.step():
                        if output.finished:
                            finished[output.request_id] = output
                            bar.update(1)
        except BaseException:
            self.engine.abort_request(ids)
            raise
        return [finished[rid] for rid in ids]

    def beam_search(self, prompts: str | list[int] | Sequence[str | list[int]],
                    params: BeamSearchParams) -> list[BeamSearchOutput]:
        """The beam_width best continuations of each text or token-id prompt (see llm_engine.beam_search)."""
        one = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        batch = cast(Sequence[str | list[int]], [prompts] if one else prompts)  # one prompt is text or token ids
        tokenizer = self.engine.tokenizer
        results = []
        for out in self._run([(p, params, 0) for p in batch], use_tqdm=False):
            if out.error is not None:
                raise RuntimeError(f"beam search failed: {out.error}")
            prompt = out.prompt_token_ids
            beams = [BeamSearchSequence(prompt + c.token_ids, c.cumulative_logprob or 0.0, len(prompt),
                                        finish_reason=c.finish_reason) for c in out.outputs]
            for beam in beams:
                beam.text = tokenizer.decode(beam.tokens) if tokenizer is not None else None
            results.append(BeamSearchOutput(beams))
        return results
