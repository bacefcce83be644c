"""Paged attention in Triton: a mixed batch of prefill chunks and decodes in one launch.

One program handles a tile of one sequence's query tokens for one kv head: the rows of its tile
are (token, query head of that kv head's group) pairs, so GQA/MQA reads each key and value once
for the whole group, and a decode (one token) still fills a tile with its group's heads. Keys are
read straight from the pool through the block table, BLOCK_N positions at a time (any block size:
each position finds its block and offset, a shift on the GPU since the block size is a constant
of the compiled kernel), with an online softmax in float32; the causal mask uses each query's
position in its sequence, so a chunk attends to its cached prefix and to itself.
Programs are listed on the host per step (`PagedBatch.tiles`: the sequence and first query row of
each tile), so the kernel needs no search and the grid is exactly the work.

Split-K (flash-decoding): with few sequences and long contexts the grid above has too few programs
to fill the GPU, and each one walks the whole context alone. `num_splits > 1` adds a grid axis that
cuts each tile's key range into partitions; every partition writes its normalized partial output
and log-sum-exp, and a second kernel combines them. `choose_splits` takes it for decode-only
batches whose programs would not fill the device and whose contexts are long.

Scores are kept in base 2 (the scale is multiplied by log2(e)) so the softmax uses exp2.
Cache layout per layer: [num_blocks, kv_heads, block_size, head_dim], last dimension contiguous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton import knobs

from llm_engine.kernels.autotune import Autotuner, shape_bucket

# Whether these kernels were defined for the interpreter (TRITON_INTERPRET=1 when this module was
# first imported): only then can they run on CPU tensors.
INTERPRETED = bool(knobs.runtime.interpret)
MIN_SPLIT_TOKENS = 256  # a partition shorter than this costs more in the combine than it saves
MAX_SPLITS = 16
_LOG2_E = 1.4426950408889634
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
# Keys per inner step and warps, timed once per device and decode shape (kernels/autotune.py): decodes
# are the bandwidth-bound steps. The first is what mixed batches, the interpreter and untuned devices use.
_DECODE_TUNER = Autotuner("paged_decode", [{"BLOCK_N": 32, "num_warps": 4}, {"BLOCK_N": 64, "num_warps": 4},
                                           {"BLOCK_N": 64, "num_warps": 8}, {"BLOCK_N": 16, "num_warps": 2}])


@triton.jit  # type: ignore[untyped-decorator]
def _paged_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr,  # type: ignore[no-untyped-def]
                            block_tables_ptr, query_start_ptr, seq_lens_ptr, tile_seq_ptr, tile_row_ptr,
                            scale, num_heads, head_dim, num_splits,
                            stride_qt, stride_qh, stride_ot, stride_oh,
                            stride_cb, stride_ch, stride_cs, stride_bt,
                            GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr,
                            DOT_DTYPE: tl.constexpr, PAGE: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(tile_seq_ptr + tile)
    first_row = tl.load(tile_row_ptr + tile)
    seq_first_row = tl.load(query_start_ptr + seq)
    seq_end_row = tl.load(query_start_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    cached = seq_len - (seq_end_row - seq_first_row)  # tokens of the sequence before this step's queries

    m = tl.arange(0, BLOCK_M)
    rows = first_row + m // GROUP
    heads = kv_head * GROUP + m % GROUP
    row_ok = (m < BLOCK_Q * GROUP) & (rows < seq_end_row)
    positions = cached + rows - seq_first_row  # each query's position in its sequence
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = tl.load(q_ptr + rows[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT_DTYPE)

    # keys up to the tile's last query, cut into num_splits partitions of whole BLOCK_N steps
    kv_end = cached + tl.minimum(first_row + BLOCK_Q, seq_end_row) - seq_first_row
    per_split = ((kv_end + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    kv_lo = split * per_split
    kv_hi = tl.minimum(kv_lo + per_split, kv_end)

    # tl.full, not tl.zeros: a nested jit function costs ~10 ms per call under the interpreter
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(kv_lo, kv_hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < kv_hi
        block = tl.load(table + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
        slot = block * stride_cb + kv_head * stride_ch + (keys % PAGE) * stride_cs
        k = tl.load(k_cache_ptr + slot[None, :] + dims[:, None], mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        s = tl.dot(q, k.to(DOT_DTYPE), input_precision="ieee") * scale
        s = tl.where(key_ok[None, :] & (keys[None, :] <= positions[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing to attend yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + slot[:, None] + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision="ieee")
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_mask = row_ok[:, None] & dim_ok[None, :]
    if not SPLIT:
        out = out_ptr + rows[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:  # partials [rows, heads, splits, (dims)] in float32, combined by _combine_splits_kernel
        part = (rows.to(tl.int64) * num_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * head_dim + dims[None, :], acc, mask=out_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok)


@triton.jit  # type: ignore[untyped-decorator]
def _combine_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_heads, head_dim, num_splits,  # type: ignore[no-untyped-def]
                           stride_ot, stride_oh, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    part = (row.to(tl.int64) * num_heads + head) * num_splits + splits
    lse = tl.load(part_lse_ptr + part, mask=splits < num_splits, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))  # an empty partition has lse -inf: weight 0
    weights = weights / tl.sum(weights, 0)
    parts = tl.load(part_out_ptr + part[:, None] * head_dim + dims[None, :],
                    mask=(splits[:, None] < num_splits) & (dims[None, :] < head_dim), other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < head_dim)


@dataclass
class PagedBatch:
    """One step's sequences as the kernel reads them; built once per step, shared by every layer."""

    query_start: torch.Tensor  # [seqs + 1] int32: sequence i's query rows are [query_start[i], query_start[i+1])
    seq_lens: torch.Tensor  # [seqs] int32: tokens of each sequence in the cache, this step's included
    block_tables: torch.Tensor  # [seqs, max_blocks] int32, padded
    query_lens: list[int]  # on the host: the tile lists and the split choice need no device sync
    max_seq_len: int
    _tiles: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
              device: torch.device) -> PagedBatch:
        width = max(1, max((len(t) for t in block_tables), default=1))
        tables = [t + [0] * (width - len(t)) for t in block_tables]
        return cls(torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device),
                   torch.tensor(seq_lens, dtype=torch.int32, device=device),
                   torch.tensor(tables, dtype=torch.int32, device=device),
                   list(query_lens), max(seq_lens, default=0))

    @property
    def decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    def tiles(self, block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each program's sequence and first query row, for tiles of `block_q` query tokens."""
        if block_q not in self._tiles:
            device = self.seq_lens.device
            if self.decode_only:  # one tile per sequence, row i
                rows = torch.arange(len(self.query_lens), dtype=torch.int32, device=device)
                self._tiles[block_q] = (rows, rows)
            else:
                seqs, firsts, row = [], [], 0
                for i, n in enumerate(self.query_lens):
                    for offset in range(0, n, block_q):
                        seqs.append(i)
                        firsts.append(row + offset)
                    row += n
                self._tiles[block_q] = (torch.tensor(seqs, dtype=torch.int32, device=device),
                                        torch.tensor(firsts, dtype=torch.int32, device=device))
        return self._tiles[block_q]


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The matmuls' input type: the cache's own, but float32 for bfloat16 under the interpreter,
    whose tl.dot mishandles bfloat16 (numpy has no such type)."""
    if INTERPRETED and dtype == torch.bfloat16:
        return tl.float32
    return _TL_DTYPES[dtype]


def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 8  # the interpreter runs programs one by one; any fixed figure will do


def choose_splits(batch: PagedBatch, num_kv_heads: int, device: torch.device) -> int:
    """Partitions per context: more than 1 only for decode-only batches whose programs (one per
    sequence and kv head) would not give each multiprocessor two, and whose contexts are long."""
    if not batch.decode_only:
        return 1
    programs = len(batch.query_lens) * num_kv_heads
    wanted = math.ceil(2 * _multiprocessors(device) / max(programs, 1))
    return max(1, min(MAX_SPLITS, wanted, batch.max_seq_len // MIN_SPLIT_TOKENS))


def tile_sizes(num_heads: int, num_kv_heads: int, head_dim: int, batch: PagedBatch) -> dict[str, int]:
    """The attention kernel's tile constants: BLOCK_Q query tokens per program (1 for decodes),
    times GROUP query heads per kv head, padded to BLOCK_M rows (16 at least, the MMA minimum);
    BLOCK_D is head_dim padded to a power of two."""
    group = num_heads // num_kv_heads
    block_q = 1 if batch.decode_only else max(1, min(64 // group, max(batch.query_lens)))
    return {"GROUP": group, "BLOCK_Q": block_q, "BLOCK_M": max(16, triton.next_power_of_2(block_q * group)),
            "BLOCK_D": max(16, triton.next_power_of_2(head_dim))}


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                    scale: float, num_splits: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [tokens, heads, head_dim] over the paged caches; returns [tokens, heads, head_dim].

    The queries' own keys and values must already be in the cache (`reshape_and_cache`).
    `num_splits` None lets `choose_splits` decide.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"paged_attention: {num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("paged_attention: k_cache and v_cache need the same strides and contiguous rows")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    sizes = tile_sizes(num_heads, num_kv_heads, head_dim, batch)
    splits = choose_splits(batch, num_kv_heads, q.device) if num_splits is None else num_splits
    tile_seqs, tile_rows = batch.tiles(sizes["BLOCK_Q"])
    if splits > 1:
        part_out = torch.empty(num_tokens, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused

    def launch(config: dict[str, int]) -> None:  # repeatable: it only writes out or the partials
        _paged_attention_kernel[(tile_seqs.shape[0], num_kv_heads, splits)](
            q, k_cache, v_cache, out, part_out, part_lse, batch.block_tables, batch.query_start, batch.seq_lens,
            tile_seqs, tile_rows, scale * _LOG2_E, num_heads, head_dim, splits,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), batch.block_tables.stride(0),
            **sizes, BLOCK_N=config["BLOCK_N"], SPLIT=splits > 1, DOT_DTYPE=_dot_dtype(q.dtype), PAGE=block_size,
            num_warps=config["num_warps"])

    config = _DECODE_TUNER.default
    if batch.decode_only:
        key = (str(q.dtype), num_heads, num_kv_heads, head_dim, block_size, splits,
               shape_bucket(num_tokens), shape_bucket(batch.max_seq_len))
        config = _DECODE_TUNER.pick(key, launch, q.device)
    launch(config)
    if splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            part_out, part_lse, out, num_heads, head_dim, splits, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=sizes["BLOCK_D"])
    return out


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, num_splits: int | None = None) -> torch.Tensor:
    """One query token per sequence (q [seqs, heads, head_dim]) over contexts of `context_lens`
    [seqs] tokens whose blocks are `block_tables` [seqs, max_blocks] (int32), all on q's device.
    For benchmarks (no host sync: the split choice takes the tables' width as the longest
    context); the engine goes through `paged_attention`."""
    num_seqs = q.shape[0]
    batch = PagedBatch(torch.arange(num_seqs + 1, dtype=torch.int32, device=q.device),
                       context_lens.to(torch.int32), block_tables.to(torch.int32), [1] * num_seqs,
                       block_tables.shape[1] * k_cache.shape[2])
    return paged_attention(q, k_cache, v_cache, batch, scale, num_splits)
