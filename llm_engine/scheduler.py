"""Token-budget continuous batching with chunked prefill, FCFS/priority order and preemption.

Every step first advances running sequences (decodes and unfinished prefill chunks) in order,
then admits waiting ones, all under `max_num_batched_tokens` and `max_num_seqs`. When the pool
runs out of blocks, the last running sequence in order (lowest priority, newest) is preempted:
its blocks are freed and it is recomputed from its tokens later, reusing cached prefix blocks.
Under the priority policy a waiting request that does not fit (blocks or `max_num_seqs`)
preempts running ones of lower priority, as in vLLM. Images are budgeted like tokens: a prefill
chunk stops before an image whose encoding would take the step's image placeholders past
`max_num_batched_tokens` (the step's first image always runs). On a decode instance of
disaggregated serving, a request prefilled elsewhere is admitted with blocks for its prompt but
nothing to compute: its KV is loaded into them (`loads`) while it sits in `loading`, outside the
batch, and it joins the running set once the load ends (`loaded`), so steps never wait on it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from llm_engine.block_manager import BlockManager
from llm_engine.config import EngineConfig
from llm_engine.multimodal.inputs import fit_encoder_budget
from llm_engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, new tokens)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    preempted: list[Sequence] = field(default_factory=list)
    loads: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, first block to load)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.policy = config.scheduling_policy
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.encoder_budget = config.max_num_batched_tokens  # left this step, in image placeholders
        self.block_manager = block_manager
        self.loads_remote_kv = getattr(config.kv_transfer_config, "kv_role", None) == "kv_consumer"
        self.waiting: list[Sequence] = []  # kept sorted by Sequence.sort_key
        self.running: list[Sequence] = []
        self.loading: list[Sequence] = []  # admitted, their prompt KV on its way from a prefill instance
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: queued, or waiting for their KV (vLLM counts both as waiting)."""
        return len(self.waiting) + len(self.loading)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def add_running(self, seq: Sequence) -> None:
        """A freshly forked sample joins the running set directly."""
        self.running.append(seq)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Move seq to a terminal state and free all its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.loading:
            self.loading.remove(seq)
        seq.set_status(status)
        self.block_manager.free(seq)

    def _fit_encoder_budget(self, seq: Sequence, start: int, num_new: int) -> int:
        """Cut a prefill chunk before an image whose encoding does not fit this step's budget."""
        if not seq.request.images:
            return num_new
        num_new, used = fit_encoder_budget(seq.request.images, start, num_new, self.encoder_budget,
                                           self.max_num_batched_tokens)
        self.encoder_budget -= used
        return num_new

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.encoder_budget = self.max_num_batched_tokens
        self.running.sort(key=lambda s: s.sort_key)
        deferred: list[Sequence] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            index += 1
            if self._yields_to_waiting(seq):
                deferred.append(seq)
                continue
            taken = self._advance(seq, budget, out)
            if taken is None:
                break
            budget -= taken
        if not out.preempted:
            budget = self._admit_waiting(out, budget)
            for seq in deferred:  # the budget the waiting requests left
                if seq.status is not SequenceStatus.RUNNING:  # preempted for a waiting one
                    continue
                if budget <= 0 or (taken := self._advance(seq, budget, out, preempt=False)) is None:
                    break
                budget -= taken
        if not out.scheduled and not out.preempted and self.waiting:
            self._unblock_beams(out)
        return out

    def _advance(self, seq: Sequence, budget: int, out: SchedulerOutput, preempt: bool = True) -> int | None:
        """Schedule a running sequence's next tokens (a decode, a draft, a prefill chunk) within
        `budget`, preempting the last running ones when the pool is short (unless not `preempt`:
        a deferred prompt chunk must not displace the requests admitted before it): the tokens
        taken (0: its next image waits for a step with encoder budget left), None when it cannot
        run (the step is full)."""
        num_new = min(len(seq.step_token_ids) - seq.num_computed_tokens, budget)
        num_new = self._fit_encoder_budget(seq, seq.num_computed_tokens, num_new)
        if num_new == 0:
            return 0
        # A draft cut by the budget keeps what fits (num_new - 1 of it, after the one real token).
        del seq.spec_token_ids[max(num_new - (seq.num_tokens - seq.num_computed_tokens), 0):]
        copies = self.block_manager.allocate_slots(seq, num_new)
        while copies is None and preempt:
            victims = self._preempt_group(self.running[-1], out)
            if seq in victims:
                break
            copies = self.block_manager.allocate_slots(seq, num_new)
        if copies is None:
            return None
        out.scheduled.append((seq, num_new))
        out.block_copies.extend(copies)
        return num_new

    def _yields_to_waiting(self, seq: Sequence) -> bool:
        """Under the priority policy, a running sequence still computing its prompt (chunked) lets
        the waiting requests of strictly higher priority have the step's budget first, and takes
        what they leave. First come first served, a request that arrived after a long prompt began
        waited for its every chunk: on a disaggregated prefill instance (priority: shortest prompt
        first) a short prompt waited for the whole of a 2k-token one, and the short prompts held
        up together then reached the decode instance together and swelled its batch."""
        return (self.policy == "priority" and bool(self.waiting)
                and seq.num_tokens - seq.num_computed_tokens > 1
                and seq.request.priority_key > self.waiting[0].request.priority_key)

    def _unblock_beams(self, out: SchedulerOutput) -> None:
        """Nothing runs while a request waits: running beams that wait for their group hold the
        blocks it needs (their siblings are queued). The newest such group goes back to the queue."""
        groups = [s for s in self.running if s.request.beam is not None]
        if groups:
            self._preempt_group(groups[-1], out)

    def _group_fits(self, seq: Sequence) -> bool:
        """A beam group is admitted whole: its queued beams (together at the queue's head) must fit
        in the free blocks without sharing any, so a group never waits for blocks it holds itself."""
        if seq.request.beam is None:
            return True
        group = [s for s in self.waiting if s.request is seq.request]
        needed = sum(self.block_manager.blocks_needed(s.num_tokens) for s in group)
        return (needed <= self.block_manager.num_free_blocks
                and len(self.running) + len(self.loading) + len(group) <= self.max_num_seqs)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting requests in order within `budget`; the budget left."""
        bm = self.block_manager
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            group = seq.request.params.n if seq.num_output_tokens == 0 else 1
            copies = None
            if seq.request.beam is not None and not any(s.request is seq.request for s in self.running):
                if not self._group_fits(seq):
                    break
            if len(self.running) + len(self.loading) + group <= self.max_num_seqs:
                cached = [] if seq.request.needs_prompt_logits else bm.find_cached_prefix(seq)
                if self._prefilled_elsewhere(seq):
                    # blocks up to the last prompt token, which is computed here to sample from
                    copies = bm.allocate_slots(seq, seq.num_tokens - 1 - len(cached) * bm.block_size, cached)
                    if copies is None:
                        break
                    self._record_admission(seq, cached)
                    self.waiting.pop(0)
                    self.loading.append(seq)
                    out.loads.append((seq, len(cached)))
                    continue
                num_new = min(seq.num_tokens - len(cached) * bm.block_size, budget)
                num_new = self._fit_encoder_budget(seq, len(cached) * bm.block_size, num_new)
                if num_new == 0:
                    break
                copies = bm.allocate_slots(seq, num_new, cached)
            if copies is None:
                victim = self._priority_victim(seq)
                if victim is None:
                    break
                before = out.num_batched_tokens
                self._preempt_group(victim, out)
                budget += before - out.num_batched_tokens
                continue
            self._admit(seq, cached)
            out.scheduled.append((seq, num_new))
            out.block_copies.extend(copies)
            budget -= num_new
        return budget

    def _prefilled_elsewhere(self, seq: Sequence) -> bool:
        """A decode instance's request whose prompt KV waits on the prefill instance (not once
        preempted: then it is recomputed here)."""
        return (self.loads_remote_kv and seq.status is SequenceStatus.WAITING
                and seq.request.params.kv_transfer_params is not None)

    def _record_admission(self, seq: Sequence, cached: list[int]) -> None:
        bm = self.block_manager
        bm.record_prefix_lookup(seq.num_tokens, len(cached) * bm.block_size)
        if seq.status is SequenceStatus.WAITING:
            seq.request.metrics.num_cached_tokens = len(cached) * bm.block_size

    def _admit(self, seq: Sequence, cached: list[int]) -> None:
        """Move the head of the waiting queue, which got its blocks, into the running set."""
        self._record_admission(seq, cached)
        self.waiting.pop(0)
        seq.set_status(SequenceStatus.RUNNING)
        self.running.append(seq)

    def loaded(self, seq: Sequence) -> None:
        """A loading sequence's KV load ended: it runs from the next step (and computes what the
        load did not bring)."""
        self.loading.remove(seq)
        seq.set_status(SequenceStatus.RUNNING)
        self.running.append(seq)

    def _priority_victim(self, seq: Sequence) -> Sequence | None:
        """Under the priority policy: the running sequence that a waiting one of strictly higher
        priority displaces when it does not fit (lowest priority, newest first)."""
        if self.policy != "priority" or not self.running:
            return None
        victim = max(self.running, key=lambda s: s.sort_key)
        return victim if victim.request.priority_key > seq.request.priority_key else None

    def _preempt_group(self, victim: Sequence, out: SchedulerOutput) -> list[Sequence]:
        """Preempt a running sequence (a beam: with its group's running beams, which cannot go on
        without it) and drop their work from this step; return them."""
        victims = ([s for s in self.running if s.request is victim.request] if victim.request.beam is not None
                   else [victim])
        for seq in victims:
            self._unschedule(seq, out)
        return victims

    def _unschedule(self, victim: Sequence, out: SchedulerOutput) -> None:
        """Preempt victim and drop its work from this step."""
        for i, (seq, _) in enumerate(out.scheduled):
            if seq is victim:
                del out.scheduled[i]
                break
        private = set(victim.block_table)
        out.block_copies = [(src, dst) for src, dst in out.block_copies if dst not in private]
        self.preempt(victim)
        out.preempted.append(victim)

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and queue it to be recomputed from its tokens."""
        self.running.remove(seq)
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.spec_token_ids = []
        seq.beam_top = None  # recomputed with its tokens
        seq.num_computed_tokens = 0
        seq.set_status(SequenceStatus.PREEMPTED)
        seq.request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)
