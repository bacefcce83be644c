"""shard_tensor_parallel on a small exported decoder layer: the column/row plan read off the graph,
the graph rewritten for one of two ranks (a norm over all heads gathered, a matrix holding q/k/v
split per part, an LM head's bias split with the vocabulary), and the named error for a block
that reads across heads. (Greedy tokens at tensor_parallel_size=2 through the engine's workers:
test_autodeploy_parity, `make test-autodeploy`.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_autodeploy_passes import Weight, context, exported
from torch import nn

import llm_engine.autodeploy.passes.sharding as sharding
import llm_engine.layers.embedding as embedding
import llm_engine.layers.linear as linear
from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import run_passes
from llm_engine.autodeploy.passes.activation import fuse_silu_and_mul
from llm_engine.autodeploy.passes.attention import replace_attention
from llm_engine.autodeploy.passes.linear import (
    FusedColumnParallelLinear,
    merge_sibling_linears,
    split_merged_outputs,
    swap_linears,
)
from llm_engine.autodeploy.passes.norm import fuse_rms_norm
from llm_engine.layers.embedding import VocabParallelEmbedding
from llm_engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class Layer(nn.Module):
    """A pre-norm-free decoder layer as Transformers writes it: embedding, GQA attention (4 query
    heads, 2 KV heads of 8) with an output projection, a gated MLP. With `q_norm_over_heads` q is
    normalized over all heads at once (OLMo 2: one rank's share of the heads needs the others');
    with `q_centered_over_heads` q loses its mean over all heads (nothing maps that onto ranks);
    with `fused_qkv` one matrix holds q/k/v and is read by column slices (Phi-3)."""

    def __init__(self, q_norm_over_heads: bool = False, heads_written_out: bool = False,
                 q_centered_over_heads: bool = False, fused_qkv: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(64, 16)
        self.attn = nn.ModuleDict({n: nn.Linear(i, o, bias=False) for n, i, o in
                                   (("q_proj", 16, 32), ("k_proj", 16, 16), ("v_proj", 16, 16), ("o_proj", 32, 16))})
        if fused_qkv:
            self.attn["qkv_proj"] = nn.Linear(16, 64, bias=False)
        self.mlp = nn.ModuleDict({n: nn.Linear(i, o, bias=False) for n, i, o in
                                  (("gate_proj", 16, 32), ("up_proj", 16, 32), ("down_proj", 32, 16))})
        self.q_norm = Weight(32) if q_norm_over_heads else None
        self.q_centered, self.fused_qkv = q_centered_over_heads, fused_qkv
        self.heads = (4, 2, 2) if heads_written_out else (-1, -1, -1)  # StableLM's view(T, heads, head_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.fused_qkv:
            qkv = self.attn["qkv_proj"](x)
            q, k, v = qkv[..., :32], qkv[..., 32:48], qkv[..., 48:]
        else:
            q, k, v = (self.attn[n](x) for n in ("q_proj", "k_proj", "v_proj"))
        if self.q_norm is not None:
            q = self.q_norm.weight * (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6))
        if self.q_centered:
            q = q - q.mean(-1, keepdim=True)
        q, k, v = (t.view(1, x.shape[1], heads, 8).transpose(1, 2) for t, heads in zip((q, k, v), self.heads))
        h = x + self.attn["o_proj"](torch.ops.autodeploy.attention(q, k, v, 8 ** -0.5, 0, 0.0).flatten(2))
        return h + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


PASSES = [replace_attention, fuse_rms_norm, merge_sibling_linears, swap_linears, fuse_silu_and_mul,
          split_merged_outputs, sharding.shard_tensor_parallel]


@pytest.fixture
def two_ranks(monkeypatch):
    """The layers and the pass as rank 0 of 2 sees them (no process group: only the graph is checked)."""
    for module in (sharding, linear, embedding):
        monkeypatch.setattr(module, "get_tp_size", lambda: 2)


def sharded(module: nn.Module) -> tuple[torch.fx.GraphModule, list[str]]:
    gm = exported(module, torch.randint(0, 64, (1, 5)))
    return gm, run_passes(gm, context(), PASSES)


def test_the_plan_is_read_off_the_graph_and_one_rank_keeps_it_as_annotations():
    gm, report = sharded(Layer())
    assert report[-1] == ("shard_tensor_parallel: 2 column / 2 row linears, 1 vocab-parallel embeddings, "
                          "0 linears replicated (annotated; one rank)")
    shards = {str(n.target) if n.op == "call_module" else "embedding": n.meta[sharding.SHARD]
              for n in gm.graph.nodes if sharding.SHARD in n.meta}
    assert shards == {"attn.q_proj_k_proj_v_proj": "column", "attn.o_proj": "row", "embedding": "vocab",
                      "mlp.gate_proj_up_proj": "column", "mlp.down_proj": "row"}
    assert not any(isinstance(m, (RowParallelLinear, VocabParallelEmbedding)) for m in gm.modules())


@pytest.mark.parametrize("heads_written_out", [False, True])
def test_two_ranks_get_parallel_linears_half_the_heads_and_halved_splits(two_ranks, heads_written_out):
    gm, report = sharded(Layer(heads_written_out=heads_written_out))
    assert report[-1].endswith("0 linears replicated (split across 2 ranks)")
    for path in ("attn.o_proj", "mlp.down_proj"):
        assert isinstance(gm.get_submodule(path), RowParallelLinear) and gm.get_submodule(path).input_size == 16
    qkv = gm.get_submodule("attn.q_proj_k_proj_v_proj")
    assert isinstance(qkv, MergedColumnParallelLinear) and qkv.output_size == 32  # half of 64
    splits = [n.args[1] for n in gm.graph.nodes if n.target is torch.ops.aten.split_with_sizes.default]
    assert splits == [[16, 8, 8]]  # q/k/v of 2 query heads and 1 KV head
    attention = next(m for m in gm.modules() if isinstance(m, PagedAttention)).attn
    assert (attention.num_heads, attention.num_kv_heads) == (2, 1)
    views = [n.args[1][2] for n in gm.graph.nodes if n.target is torch.ops.aten.view.default and len(n.args[1]) == 4]
    assert views == ([2, 1, 1] if heads_written_out else [-1, -1, -1])
    assert isinstance(gm.get_submodule("embed_tokens"), VocabParallelEmbedding)
    assert gm.get_submodule("embed_tokens").shard_size == 32


def test_a_norm_over_all_heads_reads_the_gathered_projection_and_keeps_the_ranks_columns(two_ranks):
    gm, report = sharded(Layer(q_norm_over_heads=True))
    assert report[-1].endswith("0 linears replicated (split across 2 ranks)")
    norm = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "q_norm")
    (gathered,) = norm.args
    assert isinstance(gm.get_submodule(str(gathered.target)), sharding.GatherColumns)
    split, part = gathered.args[0].args  # rank 0's q of the merged output
    assert (split.args[1], part) == ([16, 8, 8], 0)
    assert gm.get_submodule("q_norm").weight.shape == (32,)  # the whole width: nothing to split
    (mine,) = norm.users
    assert (mine.target, mine.args[1:]) == (torch.ops.aten.slice.Tensor, (-1, 0, 16))  # rank 0's two heads


def test_a_matrix_holding_q_k_v_is_split_per_part(two_ranks):
    gm, report = sharded(Layer(fused_qkv=True))
    assert report[-1].endswith("0 linears replicated (split across 2 ranks)")
    qkv = gm.get_submodule("attn.qkv_proj")
    assert isinstance(qkv, FusedColumnParallelLinear) and qkv.output_sizes == [32, 16, 16]
    assert qkv.output_size == 32  # each rank: 2 query heads, 1 KV head
    slices = sorted(n.args[2:4] for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor)
    assert slices[:2] == [(0, 16), (16, 24)] and slices[2][0] == 24  # the rank's q | k | v, not the first 32 rows
    weight = torch.arange(64.0).unsqueeze(1).expand(64, 16)
    qkv.weight_loader(qkv.weight, weight)  # the checkpoint's one tensor
    assert qkv.weight[:, 0].tolist() == [*range(0, 16), *range(32, 40), *range(48, 56)]


def test_a_block_reading_across_heads_is_named_not_split(two_ranks):
    with pytest.raises(ValueError, match="tensor parallelism: an attention block that reads across heads: node"):
        sharded(Layer(q_centered_over_heads=True))


def test_one_rank_leaves_a_block_reading_across_heads_replicated():
    _, report = sharded(Layer(q_centered_over_heads=True))
    assert report[-1] == ("shard_tensor_parallel: 1 column / 1 row linears, 1 vocab-parallel embeddings, "
                          "2 linears replicated (annotated; one rank)")


class Head(nn.Module):
    """An LM head with a bias (Phi's)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(16, 10)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def test_an_lm_heads_bias_is_split_with_the_vocabulary(two_ranks):
    gm = exported(Head(), torch.randn(1, 3, 16))
    assert run_passes(gm, context(), [sharding.shard_lm_head]) == [
        "shard_lm_head: 1 vocab-parallel LM head (split across 2 ranks)"]
    head = gm.get_submodule("lm_head")
    assert isinstance(head, sharding.VocabParallelHead) and head.bias is not None and head.bias.shape == (5,)
    head.bias.weight_loader(head.bias, torch.arange(10.0))
    assert head.bias.tolist() == [0, 1, 2, 3, 4]  # rank 0's share of the vocabulary
