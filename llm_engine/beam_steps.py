"""Beam-search requests inside the engine: each step's candidates, then forks and drops.

A beam group's live beams are its request's sequences, decoded in the continuous batch with every
other request. When a beam's logits come, its likeliest 2 x beam_width next tokens are kept on it;
once every live beam of the group has them (a token budget or a preemption can hold some back a
step), the group ranks the candidates (beam_search.rank_candidates). A beam chosen k times goes on
as itself plus k - 1 forks that share its block table (ref-counted blocks; the block manager copies
a shared partial last block before a beam writes to it); a beam not chosen is freed. Nothing is
recomputed: each step computes one token per beam.
"""

from __future__ import annotations

from typing import Any

import torch

from llm_engine.beam_search import BeamGroup, BeamSearchSequence, Candidate, final_ranking, rank_candidates
from llm_engine.block_manager import BlockManager
from llm_engine.outputs import CompletionOutput
from llm_engine.scheduler import Scheduler
from llm_engine.sequence import Request, Sequence, SequenceStatus


class BeamSteps:
    def __init__(self, block_manager: BlockManager, scheduler: Scheduler) -> None:
        self.block_manager = block_manager
        self.scheduler = scheduler

    @staticmethod
    def record(logits: torch.Tensor, rows: list[tuple[int, Sequence]]) -> list[Request]:
        """Keep each beam's likeliest next tokens (logits row `row` is its next token's); return the
        requests whose live beams all have theirs now."""
        if not rows:
            return []
        top_n = max(_group(seq.request).top_n for _, seq in rows)
        logprobs = torch.log_softmax(logits[[row for row, _ in rows]].float(), dim=-1)
        values, ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1)
        ready: dict[str, Request] = {}
        for (_, seq), row_ids, row_values in zip(rows, ids.tolist(), values.tolist()):
            n = _group(seq.request).top_n
            seq.beam_top = list(zip(row_ids[:n], row_values[:n]))
            request = seq.request
            if all(s.beam_top is not None for s in request.seqs if not s.is_finished):
                ready[request.request_id] = request
        return list(ready.values())

    def advance(self, request: Request, max_model_len: int) -> bool:
        """One step of the group: extend, fork and drop beams. True when the search is over (its
        live beams, if any, are then to be finished)."""
        group = _group(request)
        beams = [s for s in request.seqs if not s.is_finished]
        live, ended = rank_candidates([(s.cumulative_logprob, s.beam_top or []) for s in beams], group.params,
                                      group.eos_token_ids)
        num_prompt = len(request.prompt_token_ids)
        group.finished.extend(BeamSearchSequence(beams[c.parent].token_ids + [c.token], c.cum_logprob, num_prompt,
                                                 finish_reason="stop") for c in ended)
        group.steps += 1
        taken: set[int] = set()
        chosen: list[tuple[Sequence, Candidate]] = []
        for c in live:  # forks first: a fork copies its parent's tokens before the parent takes its own
            parent = beams[c.parent]
            if c.parent in taken:
                child = parent.fork(group.next_index)
                group.next_index += 1
                child.cumulative_logprob = parent.cumulative_logprob
                self.block_manager.fork(parent, child)
                self.scheduler.add_running(child)
            else:
                taken.add(c.parent)
                child = parent
            chosen.append((child, c))
        for i, seq in enumerate(beams):
            if i not in taken:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)  # dropped: its blocks go back now
        for seq, c in chosen:
            seq.token_ids.append(c.token)
            seq.cumulative_logprob = c.cum_logprob
            seq.beam_top = None
        request.seqs = [seq for seq, _ in chosen]
        return (not chosen or group.steps >= group.params.max_tokens
                or chosen[0][0].num_tokens >= max_model_len)


def beam_completions(request: Request, tokenizer: Any) -> list[CompletionOutput]:
    """The beam_width best beams so far, best first (their text once the search is over)."""
    group = _group(request)
    num_prompt = len(request.prompt_token_ids)
    live = [BeamSearchSequence(list(s.token_ids), s.cumulative_logprob, num_prompt,
                               finish_reason=s.status.finish_reason) for s in request.seqs]
    ranked = final_ranking(group.finished + live, group.params)
    decode = tokenizer is not None and request.is_finished
    return [CompletionOutput(index=k, text=tokenizer.decode(beam.output_tokens) if decode else "",
                             token_ids=beam.output_tokens, cumulative_logprob=beam.cum_logprob, logprobs=None,
                             finish_reason=beam.finish_reason) for k, beam in enumerate(ranked)]


def _group(request: Request) -> BeamGroup:
    assert request.beam is not None, f"request {request.request_id} is not a beam search"
    return request.beam
