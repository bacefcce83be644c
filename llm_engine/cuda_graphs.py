"""Decode steps replayed from CUDA graphs: one graph per batch size, captured at start.

A decode step of a small batch launches hundreds of small kernels (a few per layer), and on a GPU
the host's launch time, not the GPU, sets the step's time. A captured graph replays all of them
with one launch. Graphs replay fixed addresses and shapes, so each captured size reads its inputs
from static buffers (token ids, positions, slot mapping, context lengths and block tables as wide
as the longest sequence allowed) that `run` fills before the replay; a batch is padded up to the
next captured size with rows that attend to one token of a scratch block outside the engine's
pool (the runner allocates it), so padding never touches a real sequence's cache.

Sizes are 1, 2, 4, 8 and then every 16 up to `max_num_seqs` (vLLM's steps are similar): padding
wastes at most 15 rows of a big batch. Everything else runs eagerly: prefill chunks, mixed
batches, speculative steps (several tokens per sequence), prompt logprobs, images, batches larger
than the largest graph; `enforce_eager` turns graphs off. The attention metadata is built inside
the captured function from views of the buffers: the Triton backend's `PagedBatch` (its split
count is fixed at capture, for the longest context) and the reference backend's padded tables
(graph-safe, but it gathers every block of the full width each step: slow, kept for parity).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from llm_engine.layers.attention import AttentionBackend, TorchAttentionMetadata, TorchPagedAttention

if TYPE_CHECKING:
    from llm_engine.model_runner import StepInput

logger = logging.getLogger(__name__)

Forward = Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]  # (ids, positions, metadata) -> logits


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, then every 16, and max_num_seqs itself."""
    small = [size for size in (1, 2, 4, 8) if size < max_num_seqs]
    return [*small, *range(16, max_num_seqs, 16), max_num_seqs]


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds the batch; None when it is larger than all."""
    return next((size for size in sizes if size >= num_seqs), None)


def is_plain_decode(step: StepInput) -> bool:
    """One new token per sequence, each one's logits wanted, nothing else asked of the step."""
    return (step.mm_embeds is None and not step.prompt_rows and all(s.num_new == 1 for s in step.slices)
            and step.logit_rows == list(range(len(step.slices))))


class DecodeGraphs:
    """Static decode inputs, the captured graphs over them, and the replay of a step.

    Without `capture` (the CPU, or before it) `run` executes the same padded forward over the
    buffers eagerly, which is how the CPU tests check the padding and the metadata.
    """

    def __init__(self, forward: Forward, backend: AttentionBackend, sizes: list[int], max_blocks_per_seq: int,
                 block_size: int, pad_block: int, device: torch.device) -> None:
        self.forward_fn, self.backend, self.sizes = forward, backend, sizes
        self.block_size, self.pad_block = block_size, pad_block
        self.max_len = max_blocks_per_seq * block_size
        most = sizes[-1]
        self.input_ids = torch.zeros(most, dtype=torch.long, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((most,), pad_block * block_size, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(most, dtype=torch.int32, device=device)
        self.block_tables = torch.full((most, max_blocks_per_seq), pad_block, dtype=torch.int32, device=device)
        self.query_start = torch.arange(most + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def metadata(self, size: int) -> object:
        """The backend's metadata for `size` decodes, as views of the static buffers."""
        slots, lens, tables = self.slot_mapping[:size], self.seq_lens[:size], self.block_tables[:size]
        if isinstance(self.backend, TorchPagedAttention):
            meta = TorchAttentionMetadata(slot_blocks=slots // self.block_size, slot_offsets=slots % self.block_size,
                                          decode_rows=slice(0, size), decode_tables=tables, decode_lens=lens)
            TorchPagedAttention._add_decode_gather(meta, self.block_size)  # on the device: captured too
            return meta
        from llm_engine.kernels.attention import PagedBatch  # the Triton backend: Triton is loaded already
        from llm_engine.layers.attention_triton import TritonAttentionMetadata

        batch = PagedBatch(query_start=self.query_start[:size + 1], seq_lens=lens, block_tables=tables,
                           query_lens=[1] * size, max_seq_len=self.max_len)
        return TritonAttentionMetadata(slot_mapping=slots, batch=batch)

    def forward(self, size: int) -> torch.Tensor:
        return self.forward_fn(self.input_ids[:size], self.positions[:size], self.metadata(size))

    def warmup_inputs(self) -> None:
        """Every row at the longest context over distinct pool blocks, for the warm-up runs before each
        capture: the kernels are tuned then (kernels/autotune.py), on the traffic of long decodes
        rather than of one-token padding. Attention only reads the pool, and the rows' new keys
        and values go to the scratch block. Later steps overwrite the rows they use; columns past
        a row's context are never read."""
        most, width = self.block_tables.shape
        self.seq_lens.fill_(self.max_len)
        blocks = torch.arange(most * width, device=self.block_tables.device) % self.pad_block
        self.block_tables.copy_(blocks.view(most, width))

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per size, largest first, all sharing one memory pool (one runs at a time)."""
        self.warmup_inputs()
        pool = None
        for size in reversed(self.sizes):
            self.forward(size)  # compiles the kernels and tunes them for this shape outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.forward(size)
            pool = graph.pool()
            self.graphs[size] = (graph, logits)
        logger.info("captured CUDA graphs for decode batches of %s", self.sizes)

    def run(self, step: StepInput) -> torch.Tensor | None:
        """The step's logits [seqs, vocab] (valid until the next run), or None when it is not a
        plain decode batch within the captured sizes."""
        count = len(step.slices)
        size = padded_size(count, self.sizes) if is_plain_decode(step) else None
        if size is None:
            return None
        self.fill(step, size)
        if size in self.graphs:
            graph, logits = self.graphs[size]
            graph.replay()
            return logits[:count]
        return self.forward(size)[:count]

    def fill(self, step: StepInput, size: int) -> None:
        """Copy the step's inputs into the buffers' first rows and pad the rest up to `size`."""
        count, bs = len(step.slices), self.block_size
        pad = size - count
        width = max(-(-(s.num_computed + 1) // bs) for s in step.slices)
        tables = [s.block_table[:width] + [self.pad_block] * (width - len(s.block_table[:width]))
                  for s in step.slices]
        slots = [s.block_table[s.num_computed // bs] * bs + s.num_computed % bs for s in step.slices]
        device = self.input_ids.device

        def put(buffer: torch.Tensor, values: list[int], filler: int) -> None:
            buffer[:size].copy_(torch.tensor(values + [filler] * pad, dtype=buffer.dtype), non_blocking=True)

        put(self.input_ids, step.input_ids, 0)
        put(self.positions, step.positions, 0)
        put(self.slot_mapping, slots, self.pad_block * bs)
        put(self.seq_lens, [s.num_computed + 1 for s in step.slices], 1)
        host_tables = torch.tensor(tables + [[self.pad_block] * width] * pad, dtype=torch.int32)
        self.block_tables[:size, :width].copy_(host_tables.to(device, non_blocking=True))
