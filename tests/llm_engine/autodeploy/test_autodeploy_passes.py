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
from llm_engine.autodeploy.passes.cleanup import drop_noop_casts
from llm_engine.autodeploy.passes.flatten import flatten_batch
from llm_engine.autodeploy.passes.layout import tokens_first_attention
from llm_engine.autodeploy.passes.linear import (
    FusedColumnParallelLinear,
    merge_sibling_linears,
    split_merged_outputs,
    swap_linears,
)
from llm_engine.autodeploy.passes.norm import fuse_add_norm, fuse_layer_norm, fuse_rms_norm
from llm_engine.autodeploy.passes.rotary import TableRotary, fuse_rotary
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
    return PassContext(TorchPagedAttention(), torch.float32, torch.device("cpu"), max_positions=64)


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


def load(gm: torch.fx.GraphModule, module: nn.Module, ctx: PassContext) -> None:
    """The module's weights into the engine linears the passes made, as the model's loader does."""
    for name, tensor in module.named_parameters():
        target, shard = ctx.weight_map.get(name, (name, None))
        param = gm.get_parameter(target)
        param.weight_loader(param, tensor.detach(), *([] if shard is None else [shard]))


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
    load(gm, block, ctx)
    torch.testing.assert_close(gm(x), before)


class FusedProjections(nn.Module):
    """Phi-3's projections: one matrix holding q/k/v read by column slices, one holding gate/up
    read by a chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj, self.gate_up_proj = nn.Linear(16, 32), nn.Linear(16, 48, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv[..., :16], qkv[..., 16:24], qkv[..., 24:]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return torch.cat([q * k.sum(-1, keepdim=True), v], -1) + up * F.silu(gate)


def test_a_matrix_read_in_parts_becomes_a_merged_layer_of_those_parts():
    """So that tensor parallelism gives each rank a share of each part (test_sharding); the
    checkpoint's one tensor loads whole."""
    block, x = FusedProjections(), torch.randn(1, 5, 16)
    gm = exported(block, x)
    before = gm(x)
    ctx = context()
    assert run_passes(gm, ctx, [swap_linears]) == [
        "swap_linears: 2 linears -> engine linear layers (2 holding several projections)"]
    parts = {path: gm.get_submodule(path) for path in ("qkv_proj", "gate_up_proj")}
    assert all(isinstance(m, FusedColumnParallelLinear) for m in parts.values())
    assert [m.output_sizes for m in parts.values()] == [[16, 8, 8], [24, 24]]
    load(gm, block, ctx)
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
    assert run_passes(gm, ctx, [tokens_first_attention]) == [
        "tokens_first_attention: 1 of 1 attention layers take q/k/v tokens first"]
    assert paged.tokens_first and not any(n.target is torch.ops.aten.transpose.int for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x[:, :6], prefill), expected[:, :6])  # the same slots written again
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


class Casts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * 2 + x.to(torch.float32).type_as(x) + x.to(torch.bfloat16).float()


def test_drop_noop_casts_keeps_real_ones():
    x = torch.randn(1, 3, 4)
    gm = exported(Casts(), x)
    before = gm(x)
    assert run_passes(gm, context(), [drop_noop_casts]) == ["drop_noop_casts: 3 no-op casts dropped"]
    assert [n.args[1] for n in gm.graph.nodes if n.target is torch.ops.aten.to.dtype] == [torch.bfloat16, torch.float32]
    torch.testing.assert_close(gm(x), before, rtol=0, atol=0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class Residual(nn.Module):
    """A decoder layer's residual stream: norm(r + a), then the sum read again; with
    `read_late` both addends are also read after the add (neither may be overwritten)."""

    def __init__(self, read_late: bool) -> None:
        super().__init__()
        self.norm, self.proj = Weight(16), nn.Linear(16, 16, bias=False)
        self.read_late = read_late

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual, update = x * 2, self.proj(x)
        summed = residual + update
        out = self.proj(rms_norm(summed, self.norm.weight)) + summed
        return out + residual + update if self.read_late else out


@pytest.mark.parametrize("read_late", [False, True])
def test_fuse_add_norm_updates_the_residual_in_place_only_when_nothing_reads_it_later(read_late):
    x = torch.randn(1, 5, 16)
    gm = exported(Residual(read_late), x)
    before = gm(x)
    report = run_passes(gm, context(), [fuse_rms_norm, fuse_add_norm])
    assert report[1] == f"fuse_add_norm: {0 if read_late else 1} residual adds fused into RMSNorm"
    norm_calls = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == "norm"]
    assert [len(n.args) for n in norm_calls] == [1 if read_late else 2]
    torch.testing.assert_close(gm(x), before)


class LayerNorms(nn.Module):
    """A LayerNorm with bias after a residual add, one without bias, and a functional one over
    a weight of another module (left as captured)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16, bias=False)
        self.norm, self.plain = nn.LayerNorm(16, eps=1e-5), nn.LayerNorm(16, eps=1e-6, bias=False)
        for param in (self.norm.weight, self.norm.bias, self.plain.weight):
            nn.init.normal_(param)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x * 2
        summed = residual + self.proj(x)
        h = self.proj(self.norm(summed)) + summed
        return self.plain(h) + F.layer_norm(h, (16,), self.proj.weight[0])


def test_fuse_layer_norm_and_its_residual_add():
    x = torch.randn(1, 5, 16)
    gm = exported(LayerNorms(), x)
    before = gm(x)
    report = run_passes(gm, context(), [fuse_layer_norm, fuse_add_norm])
    assert report == ["fuse_layer_norm: 2 LayerNorms -> the engine's LayerNorm",
                      "fuse_add_norm: 0 residual adds fused into RMSNorm, 2 residual adds fused into LayerNorm"]
    assert (gm.get_submodule("norm").bias is not None, gm.get_submodule("plain").bias) == (True, None)
    assert [len(n.args) for n in gm.graph.nodes if n.op == "call_module" and n.target == "norm"] == [2]
    assert sum(n.target is torch.ops.aten.layer_norm.default for n in gm.graph.nodes) == 1
    torch.testing.assert_close(gm(x), before, rtol=0, atol=0)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


class Rope(nn.Module):
    """Llama's attention block as Transformers writes it: cos/sin from inv_freq and the
    positions, rotate-half RoPE on q and k (on the first `rotated` dims of each head only: partial
    rotary), the captured attention op. With `q_read_later` the q projection's output is read
    again after the attention (so it cannot be rotated in place)."""

    def __init__(self, rotated: int = 8, q_read_later: bool = False) -> None:
        super().__init__()
        self.proj = nn.ModuleDict({n: nn.Linear(16, size, bias=False) for n, size in
                                   (("q_proj", 32), ("k_proj", 16), ("v_proj", 16))})
        inv_freq = 1.0 / (500.0 ** (torch.arange(0, rotated, 2).float() / rotated))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rotated, self.q_read_later = rotated, q_read_later

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        freqs = (self.inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1)
        projected = {n: self.proj[n](x) for n in ("q_proj", "k_proj", "v_proj")}
        q, k, v = (projected[n].view(1, x.shape[1], -1, 8).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
        rot, keep = self.rotated, slice(self.rotated, None)
        if rot < 8:  # as GPT-NeoX/StableLM/Phi: the rotated part sliced once, the rest put back after
            q_rot, k_rot = q[..., :rot], k[..., :rot]
            q = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q[..., keep]), dim=-1)
            k = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k[..., keep]), dim=-1)
        else:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = torch.ops.autodeploy.attention(q, k, v, 8 ** -0.5, 0, 0.0).flatten(2)
        return out + projected["q_proj"] if self.q_read_later else out


def run_paged(gm: torch.fx.GraphModule, x: torch.Tensor, positions: torch.Tensor, flat: bool = False) -> torch.Tensor:
    """A 6-token prefill then one decode over a fresh pool; the outputs of both (`flat`: the
    graph takes and returns tensors without the batch dimension, as after flatten_batch)."""
    paged = next(m for m in gm.modules() if isinstance(m, PagedAttention))
    paged.attn.k_cache, paged.attn.v_cache = torch.zeros(4, 2, 4, 8), torch.zeros(4, 2, 4, 8)
    backend = TorchPagedAttention()
    outputs = []
    for start, end in ((0, 6), (6, 7)):
        metadata = backend.build_metadata([SeqSlice(start, end - start, [2, 0])], 4, torch.device("cpu"))
        inputs = (x[0, start:end], positions[0, start:end]) if flat else (x[:, start:end], positions[:, start:end])
        out = gm(*inputs, metadata)
        outputs.append(out.unsqueeze(0) if flat else out)
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("q_read_later,rotated", [(False, 8), (True, 8), (False, 4), (True, 4)])
def test_fuse_rotary_puts_the_models_own_tables_on_the_engine_op(q_read_later, rotated):
    """Whole heads, and partial rotary (the first 4 of 8 dims rotated, the rest concatenated back)."""
    x, positions = torch.randn(1, 7, 16), torch.arange(7).unsqueeze(0)
    gm = exported(Rope(rotated=rotated, q_read_later=q_read_later), x[:, :4], torch.arange(4).unsqueeze(0))
    ctx = context()
    run_passes(gm, ctx, [replace_attention])
    before = run_paged(gm, x, positions)
    assert run_passes(gm, ctx, [fuse_rotary]) == ["fuse_rotary: 1 layers' q/k -> the engine's rotary op"]
    rotary = next(m for m in gm.modules() if isinstance(m, TableRotary))
    assert rotary.in_place is not q_read_later
    assert tuple(rotary.rotary.cos.shape) == (64, rotated // 2)
    gone = (torch.ops.aten.cos.default, torch.ops.aten.neg.default, torch.ops.aten.cat.default)
    assert not any(n.target in gone for n in gm.graph.nodes)
    torch.testing.assert_close(run_paged(gm, x, positions), before)
    assert run_passes(gm, ctx, [tokens_first_attention]) == [
        "tokens_first_attention: 1 of 1 attention layers take q/k/v tokens first"]
    assert not any(n.target is torch.ops.aten.transpose.int for n in gm.graph.nodes)
    torch.testing.assert_close(run_paged(gm, x, positions), before)


class Projections(Block):
    """q/k/v and gate/up projections read separately, as Transformers' layers read them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.attn[n](x) for n in ("q_proj", "k_proj", "v_proj"))
        mlp = self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](x)) * self.mlp["up_proj"](x))
        return q * 2 + torch.cat([v, k], dim=-1) + mlp


def test_split_merged_outputs_takes_qkv_in_one_split_and_leaves_an_output_read_whole():
    block, x = Projections(), torch.randn(1, 6, 16)
    gm = exported(block, x)
    before = gm(x)
    ctx = context()
    report = run_passes(gm, ctx, [merge_sibling_linears, swap_linears, fuse_silu_and_mul, split_merged_outputs])
    assert report[-1] == "split_merged_outputs: 1 merged outputs -> one split each"  # gate/up: read by SiluAndMul
    splits = [n for n in gm.graph.nodes if n.target is torch.ops.aten.split_with_sizes.default]
    assert [(n.args[0].target, n.args[1]) for n in splits] == [("attn.q_proj_k_proj_v_proj", [16, 8, 8])]
    assert not any(n.target is torch.ops.aten.slice.Tensor for n in gm.graph.nodes)
    load(gm, block, ctx)
    torch.testing.assert_close(gm(x), before)


def ops(gm: torch.fx.GraphModule, *targets: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target in targets)


def test_flatten_batch_runs_a_decoder_layer_without_the_batch_dimension():
    x, positions, rope = torch.randn(1, 7, 16), torch.arange(7).unsqueeze(0), Rope()
    gm = exported(rope, x[:, :4], torch.arange(4).unsqueeze(0))
    ctx = context()
    run_passes(gm, ctx, [replace_attention, merge_sibling_linears, swap_linears, fuse_rotary, tokens_first_attention,
                         split_merged_outputs])
    load(gm, rope, ctx)
    before = run_paged(gm, x, positions)
    reshapes = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.flatten.using_ints)
    views = ops(gm, *reshapes)
    assert run_passes(gm, ctx, [flatten_batch]) == [
        "flatten_batch: 14 nodes without the batch dimension, 0 given it back for an op no rule knows"]
    attention, rotary = (next(m for m in gm.modules() if isinstance(m, kind)) for kind in (PagedAttention, TableRotary))
    assert not attention.batch_dim and not rotary.batch_dim
    # no op adds or removes the batch dimension, and the attention's output reshape is gone
    assert ops(gm, torch.ops.aten.unsqueeze.default, torch.ops.aten.select.int) == 0
    assert ops(gm, *reshapes) == views - 1
    torch.testing.assert_close(run_paged(gm, x, positions, flat=True), before)


def test_flatten_batch_gives_the_dimension_back_where_no_rule_applies():
    """Partial rotary stays as captured: its cos/sin matmul has no rule and gets the positions
    back as [1, T]; q and k meet the [1, 1, T, dim] tables with the batch dimension again."""
    x, positions = torch.randn(1, 7, 16), torch.arange(7).unsqueeze(0)
    gm = exported(Rope(rotated=4), x[:, :4], torch.arange(4).unsqueeze(0))
    ctx = context()
    run_passes(gm, ctx, [replace_attention])
    before = run_paged(gm, x, positions)
    report = run_passes(gm, ctx, [flatten_batch])[0]
    assert report.endswith("given it back for an op no rule knows") and not report.endswith(" 0 given it back for an op no rule knows")
    assert next(m for m in gm.modules() if isinstance(m, PagedAttention)).batch_dim  # its q/k arrive batched
    torch.testing.assert_close(run_paged(gm, x, positions, flat=True), before)


@pytest.mark.parametrize("module", [Norms(), Residual(read_late=True), Cumulative()], ids=["norms", "residual", "cumsum"])
def test_flatten_batch_keeps_every_graphs_values(module):
    x = torch.randn(1, 5, 16)
    gm = exported(module, x)
    before = gm(x)
    ctx = context()
    run_passes(gm, ctx, [fuse_rms_norm, fuse_add_norm, flatten_batch])
    for name, offset in ctx.weight_offsets.items():  # what the loader does (Gemma's 1 + w)
        gm.get_parameter(name).data.add_(offset)
    torch.testing.assert_close(gm(x[0]), before[0])
