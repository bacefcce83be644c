"""Speculative decoding with a draft model: a smaller model over the same vocabulary proposes.

The draft runs in the engine's process on its own `ModelRunner` with its own small KV pool and a
block table per sequence. Before proposing it catches up on what the target accepted since last
time (one batched forward over every sequence's new tokens, whose last rows give the first draft
tokens), then proposes the rest greedily in batched one-token forwards. Which tokens its pool
holds is remembered per sequence, so a rejected draft is rolled back by keeping only the part
that the sequence's tokens still agree with. The engine verifies drafts exactly as prompt-lookup
drafts (`LLMEngine._accept_draft`); a greedy (point-mass) draft keeps sampled outputs on the
target's distribution. Prefix caching is the target's alone: the draft recomputes a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llm_engine.config import EngineConfig
from llm_engine.layers.attention import SeqSlice
from llm_engine.loader import ModelSource
from llm_engine.model_runner import ModelRunner, StepInput
from llm_engine.sampler import greedy_tokens
from llm_engine.sequence import Sequence


@dataclass
class DraftKV:
    """One sequence's part of the draft pool: the tokens whose KV it holds, and their blocks."""

    token_ids: list[int] = field(default_factory=list)
    num_target_tokens: int = 0  # how many of token_ids were the sequence's own when proposing
    block_table: list[int] = field(default_factory=list)


class DraftModelProposer:
    """Greedy k-token proposals from a draft model, its KV kept in step with each sequence."""

    def __init__(self, config: EngineConfig, draft_model: str, num_blocks: int, vocab_size: int) -> None:
        try:
            source = ModelSource(draft_model)
        except ValueError as exc:
            raise ValueError(f"speculative_config.{exc}") from exc
        hf_config = source.hf_config()
        text_config = hf_config.get_text_config()
        if text_config.vocab_size != vocab_size:
            raise ValueError(f"speculative_config.model: the draft's vocabulary has {text_config.vocab_size} "
                             f"tokens, the target's {vocab_size}; they must share one tokenizer")
        draft_config = replace(config, model=draft_model, tokenizer=None, num_kv_blocks=num_blocks,
                               speculative_config=None, kv_transfer_config=None)
        self.runner = ModelRunner(draft_config, hf_config, source)
        self.block_size = config.block_size
        self.max_model_len = text_config.max_position_embeddings
        self.free_blocks = list(range(self.runner.num_blocks))
        self.kv: dict[int, DraftKV] = {}  # by seq_id

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def free(self, seq: Sequence) -> None:
        """Give back a sequence's draft blocks (finished, aborted or preempted)."""
        kv = self.kv.pop(seq.seq_id, None)
        if kv is not None:
            self.free_blocks.extend(reversed(kv.block_table))

    def propose(self, wanted: list[tuple[Sequence, int]]) -> None:
        """Set `spec_token_ids` of each (sequence, k): up to k greedy draft tokens (none for a
        sequence the draft pool or the draft's context length has no room for)."""
        batch: list[tuple[Sequence, int, DraftKV]] = []
        for seq, k in wanted:
            k = min(k, self.max_model_len - seq.num_tokens)
            kv = self._sync(seq, k) if k > 0 else None
            if kv is not None:
                batch.append((seq, k, kv))
        if not batch:
            return
        step = StepInput([], [], [], [], [], [])
        for seq, _, kv in batch:  # catch up: every token the draft's pool does not hold yet
            start = len(kv.token_ids)
            self._add_rows(step, seq.token_ids[start:], start, kv.block_table)
            kv.token_ids = list(seq.token_ids)
            kv.num_target_tokens = seq.num_tokens
        for (seq, _, _), token in zip(batch, self._greedy(step), strict=True):
            seq.spec_token_ids = [token]
        for i in range(1, max(k for _, k, _ in batch)):
            active = [(seq, kv) for seq, k, kv in batch if k > i]
            step = StepInput([], [], [], [], [], [])
            for seq, kv in active:
                token = seq.spec_token_ids[-1]
                self._add_rows(step, [token], len(kv.token_ids), kv.block_table)
                kv.token_ids.append(token)
            for (seq, _), token in zip(active, self._greedy(step), strict=True):
                seq.spec_token_ids.append(token)

    def _sync(self, seq: Sequence, k: int) -> DraftKV | None:
        """Roll the sequence's draft KV back to what its tokens still agree with and give it room
        for the tokens to catch up on and k - 1 draft tokens; None if the pool is full."""
        kv = self.kv.setdefault(seq.seq_id, DraftKV())
        keep = min(kv.num_target_tokens, seq.num_tokens - 1)  # the last token is always fed: its logits draft
        while (keep < len(kv.token_ids) and keep < seq.num_tokens - 1
               and kv.token_ids[keep] == seq.token_ids[keep]):
            keep += 1
        del kv.token_ids[keep:]
        needed = -(-(seq.num_tokens + k - 1) // self.block_size)
        while len(kv.block_table) > needed:
            self.free_blocks.append(kv.block_table.pop())
        missing = needed - len(kv.block_table)
        if missing > len(self.free_blocks):
            self.free(seq)
            return None
        kv.block_table.extend(self.free_blocks.pop() for _ in range(missing))
        return kv

    @staticmethod
    def _add_rows(step: StepInput, token_ids: list[int], start: int, block_table: list[int]) -> None:
        """One sequence's tokens at positions start.. in a batched step; its last row is sampled."""
        step.input_ids.extend(token_ids)
        step.positions.extend(range(start, start + len(token_ids)))
        step.slices.append(SeqSlice(start, len(token_ids), block_table))
        step.logit_rows.append(len(step.input_ids) - 1)

    def _greedy(self, step: StepInput) -> list[int]:
        logits, _ = self.runner.run_step(step)
        return [int(t) for t in greedy_tokens(logits).tolist()]
