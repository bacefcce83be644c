"""shard_tensor_parallel on a small exported decoder layer: the column/row plan read off the graph,
the graph rewritten for one of two ranks, and the named error for a block that reads across
heads. (Greedy tokens at tensor_parallel_size=2 through the engine's workers: test_autodeploy_parity,
`make test-autodeploy`.)"""

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
from llm_engine.autodeploy.passes.linear import merge_sibling_linears, split_merged_outputs, swap_linears
from llm_engine.autodeploy.passes.norm import fuse_rms_norm
from llm_engine.layers.embedding import VocabParallelEmbedding
from llm_engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class Layer(nn.Module):
    """A pre-norm-free decoder layer as Transformers writes it: embedding, GQA attention (4 query
    heads, 2 KV heads of 8) with an output projection, a gated MLP. With `q_norm_over_heads` q is
    normalized over all heads at once (OLMo 2), which one rank's share of the heads cannot do."""

    def __init__(self, q_norm_over_heads: bool = False, heads_written_out: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(64, 16)
        self.attn = nn.ModuleDict({n: nn.Linear(i, o, bias=False) for n, i, o in
                                   (("q_proj", 16, 32), ("k_proj", 16, 16), ("v_proj", 16, 16), ("o_proj", 32, 16))})
        self.mlp = nn.ModuleDict({n: nn.Linear(i, o, bias=False) for n, i, o in
                                  (("gate_proj", 16, 32), ("up_proj", 16, 32), ("down_proj", 32, 16))})
        self.q_norm = Weight(32) if q_norm_over_heads else None
        self.heads = (4, 2, 2) if heads_written_out else (-1, -1, -1)  # StableLM's view(T, heads, head_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        q = self.attn["q_proj"](x)
        if self.q_norm is not None:
            q = self.q_norm.weight * (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6))
        q, k, v = (t.view(1, x.shape[1], heads, 8).transpose(1, 2)
                   for t, heads in zip((q, self.attn["k_proj"](x), self.attn["v_proj"](x)), self.heads))
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


def test_a_block_reading_across_heads_is_named_not_split(two_ranks):
    with pytest.raises(ValueError, match="tensor parallelism: an attention block that reads across heads: node"):
        sharded(Layer(q_norm_over_heads=True))


def test_one_rank_leaves_a_block_reading_across_heads_replicated():
    _, report = sharded(Layer(q_norm_over_heads=True))
    assert report[-1] == ("shard_tensor_parallel: 1 column / 1 row linears, 1 vocab-parallel embeddings, "
                          "2 linears replicated (annotated; one rank)")
