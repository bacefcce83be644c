"""LLM: the offline facade — build an engine, generate for a list of prompts with a progress bar."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm import tqdm

from llm_engine.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence, expand
from llm_engine.config import EngineConfig
from llm_engine.llm_engine import LLMEngine
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

# text, token ids, or {"prompt"/"prompt_token_ids": ..., "multi_modal_data": {"image": [...]}}
Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str, **kwargs) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"priority: got {len(priorities)} values for {len(prompts)} prompts")
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt, p, prio in zip(ids, prompts, params, priorities):
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
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        engine = self.engine
        width = params.beam_width
        live: list[list[BeamSearchSequence]] = []
        for prompt in prompts:
            _, ids = engine.tokenize(prompt)  # type: ignore[arg-type]
            live.append([BeamSearchSequence(list(ids), 0.0, len(ids))])
        finished: list[list[BeamSearchSequence]] = [[] for _ in live]
        step = SamplingParams(temperature=0, max_tokens=1, logprobs=2 * width, ignore_eos=True)
        for _ in range(params.max_tokens):
            beams = [(p, beam) for p, group in enumerate(live) for beam in group]
            if not beams:
                break
            outputs = self.generate([beam.tokens for _, beam in beams], step, use_tqdm=False)
            candidates: list[list[BeamSearchSequence]] = [[] for _ in live]
            for (p, beam), out in zip(beams, outputs):
                top = {token: lp.logprob for token, lp in (out.outputs[0].logprobs or [{}])[0].items()}
                best = sorted(top, key=top.__getitem__, reverse=True)[:2 * width]
                candidates[p] += expand(beam, {t: top[t] for t in best}, engine.eos_token_ids, params.ignore_eos)
            for p, group in enumerate(candidates):
                group.sort(key=lambda b: b.cum_logprob, reverse=True)
                live[p] = []
                for rank, cand in enumerate(group):
                    if cand.finish_reason is not None:
                        if rank < width:  # an ended beam counts if it ranks among the best
                            finished[p].append(cand)
                    elif len(live[p]) < width:
                        live[p].append(cand)
        results = []
        for done, running in zip(finished, live):
            for beam in running:
                beam.finish_reason = "length"
            ranked = sorted(done + running, key=lambda b: b.score(params.length_penalty), reverse=True)[:width]
            for beam in ranked:
                beam.text = engine.tokenizer.decode(beam.tokens) if engine.tokenizer is not None else None
            results.append(BeamSearchOutput(ranked))
        return results

