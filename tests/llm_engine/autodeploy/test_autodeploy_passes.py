"""Each AutoDeploy pass on a small exported graph: what it replaces, and that the graph computes
the same values afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.autodeploy.capture import clean_graph, plain_graph_module
from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, run_passes
from llm_engine.autodeploy.passes.activation import fuse_silu_and_mul
from llm_engine.autodeploy.passes.attention import replace_attention
from llm_engine.autodeploy.passes.check import check_supported
from llm_engine.autodeploy.passes.linear import merge_sibling_linears, swap_linears
from llm_engine.autodeploy.passes.norm import fuse_rms_norm
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.attention import SeqSlice, TorchPagedAttention
from llm_engine.layers.linear import MergedColumnParallelLinear, ReplicatedLinear
from llm_engine.layers.norm import RMSNorm


def exported(module: nn.Module, *inputs: torch.Tensor):
    tokens = torch.export.Dim("tokens", min=1, max=512)
    program = torch.export.export(module.eval(), inputs, dynamic_shapes=[{1: tokens}] * len(inputs), strict=False)
    gm = plain_graph_module(program.module())
    clean_graph(gm, torch.device("cpu"))
    return gm


def context() -> PassContext:
    return PassContext(TorchPagedAttention(), torch.float32)


class Weight(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size) * 0.1)


class Norms(nn.Module):
    """Llama's RMSNorm then Gemma's (1 + weight, multiplied in float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.llama, self.gemma = Weight(16), Weight(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        a = self.llama.weight * h.to(x.dtype)
        g = a.float()
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (g * (1.0 + self.gemma.weight.float())).type_as(a)


def test_fuse_rms_norm_replaces_both_styles_and_folds_gemmas_offset():
    x = torch.randn(1, 5, 16)
    gm = exported(Norms(), x)
    before = gm(x)
    ctx = context()
    report = run_passes(gm, ctx, [fuse_rms_norm])
    assert report == ["fuse_rms_norm: 2 RMSNorms fused"]
    assert [type(gm.get_submodule(n)) for n in ("llama", "gemma")] == [RMSNorm, RMSNorm]
    assert ctx.weight_offsets == {"gemma.weight": 1.0}
    gm.get_parameter("gemma.weight").data.add_(1.0)  # what the loader does
    torch.testing.assert_close(gm(x), before)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.ModuleDict({n: nn.Linear(16, size, bias=False) for n, size in
                                   (("q_proj", 16), ("k_proj", 8), ("v_proj", 8))})
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(16, 32, bias=False), "up_proj": nn.Linear(16, 32, bias=False),
                                  "down_proj": nn.Linear(32, 16, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = torch.cat([self.attn[n](x) for n in ("q_proj", "k_proj", "v_proj")], dim=-1)
        mlp = self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](x)) * self.mlp["up_proj"](x))
        return qkv[..., :16] + mlp


def test_linear_passes_merge_siblings_swap_to_engine_layers_and_fuse_silu():
    block, x = Block(), torch.randn(1, 6, 16)
    gm = exported(block, x)
    before = gm(x)
    ctx = context()
    report = run_passes(gm, ctx, [merge_sibling_linears, swap_linears, fuse_silu_and_mul])
    assert report == ["merge_sibling_linears: 2 merged (gate_proj+up_proj, q_proj+k_proj+v_proj)",
                      "swap_linears: 1 linears -> engine linear layers", "fuse_silu_and_mul: 1 gated MLPs -> SiluAndMul"]
    assert isinstance(gm.get_submodule("attn.q_proj_k_proj_v_proj"), MergedColumnParallelLinear)
    assert isinstance(gm.get_submodule("mlp.down_proj"), ReplicatedLinear)
    assert isinstance(gm.get_submodule("mlp.gate_proj_up_proj_act"), SiluAndMul)
    assert ctx.weight_map["attn.k_proj.weight"] == ("attn.q_proj_k_proj_v_proj.weight", 1)
    for name, tensor in block.state_dict().items():  # load as the model does
        target, shard = ctx.weight_map.get(name, (name, None))
        param = gm.get_parameter(target)
        param.weight_loader(param, tensor, *([] if shard is None else [shard]))
    torch.testing.assert_close(gm(x), before)


class Attend(nn.Module):
    """GQA attention through the captured op: 4 query heads, 2 KV heads, head size 8."""

    def __init__(self, window: int, softcap: float) -> None:
        super().__init__()
        self.proj = nn.ModuleDict({n: nn.Linear(16, size, bias=False) for n, size in
                                   (("q_proj", 32), ("k_proj", 16), ("v_proj", 16))})
        self.window, self.softcap = window, softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.proj[n](x).view(1, x.shape[1], -1, 8).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
        return torch.ops.autodeploy.attention(q, k, v, 8 ** -0.5, self.window, self.softcap).flatten(2)


@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (3, 5.0)])
def test_replace_attention_runs_paged_over_the_pool(window, softcap):
    x = torch.randn(1, 7, 16)
    gm = exported(Attend(window, softcap), x[:, :4])
    expected = gm(x)  # the op's own reference: all 7 tokens at once
    ctx = context()
    assert run_passes(gm, ctx, [replace_attention])[0].startswith("replace_attention: 1 layers -> paged attention")
    paged = next(m for m in gm.modules() if isinstance(m, PagedAttention))
    paged.attn.k_cache, paged.attn.v_cache = torch.zeros(4, 2, 4, 8), torch.zeros(4, 2, 4, 8)
    prefill = ctx.backend.build_metadata([SeqSlice(0, 6, [2, 0])], 4, torch.device("cpu"))
    torch.testing.assert_close(gm(x[:, :6], prefill), expected[:, :6])
    decode = ctx.backend.build_metadata([SeqSlice(6, 1, [2, 0])], 4, torch.device("cpu"))
    torch.testing.assert_close(gm(x[:, 6:], decode), expected[:, 6:])


class Cumulative(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1)


def test_unsupported_op_is_named():
    gm = exported(Cumulative(), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match=r"unsupported op aten\.cumsum\.default at node 'cumsum'"):
        check_supported(gm, context())
    with pytest.raises(ValueError, match="no attention found"):
        replace_attention(gm, context())
