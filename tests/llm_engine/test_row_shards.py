"""A quantized row-parallel layer at two ranks, loaded through its own weight loader from the
whole layer's packed tensors (a pre-quantized checkpoint's, or a built engine's saved layer;
layers/row_shards.py): each rank's share holds exactly its columns of the whole quantized weight,
the ranks' partial products add up to the one-rank product, act-order layers included (each rank's
columns regrouped and padded), and a group straddling two ranks is refused naming the layer.
(Greedy tokens through the engine's workers: test_llm_tensor_parallel_quantized.py and
test_engine_dir, `make test-llm-parallel` / `make test-autodeploy`.)"""

from __future__ import annotations

import pytest
import torch
from conftest import int4_rounding_bound

import llm_engine.layers.linear as linear
from llm_engine.layers.linear import ReplicatedLinear, RowParallelLinear
from llm_engine.layers.quantization import QuantScheme, WeightOnlyLinearMethod, dequantize

OUT = 24
DOWN = "model.layers.0.mlp.down_proj"


def float_weight(inputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(OUT, inputs), torch.randn(OUT)


def one_rank_layer(scheme: QuantScheme, inputs: int) -> ReplicatedLinear:
    """A layer quantized from random float weights, its tensors as a checkpoint holds them (prequantized)."""
    method = WeightOnlyLinearMethod(scheme)
    layer = ReplicatedLinear(inputs, OUT, bias=True, quant_method=method)
    layer.weight.data, layer.bias.data = float_weight(inputs)
    method.process_weights_after_loading(layer)
    method.prequantized = True
    return layer


def act_order(layer: ReplicatedLinear) -> ReplicatedLinear:
    """The same weights stored as GPTQ's act-order does: inputs in a shuffled order (input_perm),
    each group contiguous in that order."""
    scheme = layer.quant_method.scheme
    perm = torch.randperm(layer.input_size, generator=torch.Generator().manual_seed(5))
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), scheme.group_size)
    permuted = ReplicatedLinear(layer.input_size, OUT, bias=True, quant_method=WeightOnlyLinearMethod(scheme))
    permuted.weight.data.copy_(weight[:, perm])
    permuted.bias.data.copy_(layer.bias)
    permuted.quant_method.process_weights_after_loading(permuted)
    permuted.quant_method = WeightOnlyLinearMethod(scheme, prequantized=True, act_order=True)
    permuted.input_perm = torch.nn.Parameter(perm, requires_grad=False)
    return permuted


def rank_layer(full: ReplicatedLinear, rank: int, monkeypatch: pytest.MonkeyPatch,
               rounded_at_load: bool = False) -> RowParallelLinear:
    """Rank `rank` of two, loaded from `full`'s packed tensors, or (rounded_at_load) from its float weight."""
    monkeypatch.setattr(linear, "get_tp_size", lambda: 2)
    monkeypatch.setattr(linear, "get_tp_rank", lambda: rank)
    method = full.quant_method
    layer = RowParallelLinear(full.input_size, OUT, True, torch.float32,
                              WeightOnlyLinearMethod(method.scheme, prequantized=not rounded_at_load,
                                                     act_order=method.act_order))
    layer.prefix = DOWN
    saved = dict(full.named_parameters())
    if rounded_at_load:
        saved["weight"], saved["bias"] = float_weight(full.input_size)
    for name, param in list(layer.named_parameters()):
        param.weight_loader(param, saved[name])
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def weight_of(layer: torch.nn.Module) -> torch.Tensor:
    """The float weight [N, inputs] in the layer's input order."""
    method = layer.quant_method
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), method.group(layer))
    if not method.act_order:
        return weight
    ordered = torch.zeros(weight.shape[0], layer.input_size + 1)  # the last column: the padding's zero input
    ordered[:, layer.input_perm] = weight
    return ordered[:, :-1]


SCHEMES = [
    (QuantScheme("int8"), 128),  # per output channel: both ranks keep the row's scale
    (QuantScheme("int8", 32), 128),
    (QuantScheme("int4", 32, symmetric=False), 128),  # two groups per rank
    (QuantScheme("int4", 64), 256),
    (QuantScheme("int4", 128, symmetric=False), 64),  # one group wider than the row (the default g128, small layers)
    (QuantScheme("int4", None, symmetric=False), 64),  # one group per row (GPTQ group_size -1): nibbles repacked
    (QuantScheme("fp8", per_tensor=True), 128),
    (QuantScheme("w4a8", 32, symmetric=False), 128),
]


@pytest.mark.parametrize(("scheme", "inputs"), SCHEMES,
                         ids=lambda value: value.describe() if isinstance(value, QuantScheme) else str(value))
def test_each_rank_holds_its_columns_of_the_quantized_weight(scheme, inputs, monkeypatch):
    check_ranks(one_rank_layer(scheme, inputs), monkeypatch)


@pytest.mark.parametrize(("scheme", "inputs"), [
    (QuantScheme("int4", 64, symmetric=False), 256),  # runs of ~32 per group and rank, padded to sub-groups of 32
    (QuantScheme("int4", 32, symmetric=False), 192),
    (QuantScheme("int8", 64), 128),  # 8-bit GPTQ with desc_act
    (QuantScheme("int4", 24, symmetric=False), 96),  # groups that are not whole sub-groups: padded to whole groups
], ids=lambda value: value.describe() if isinstance(value, QuantScheme) else str(value))
def test_act_order_ranks_regroup_their_columns(scheme, inputs, monkeypatch):
    full = act_order(one_rank_layer(scheme, inputs))
    ranks = check_ranks(full, monkeypatch)
    assert all(layer.input_perm.numel() > inputs // 2 for layer in ranks)  # padded: the groups are split unevenly


@pytest.mark.parametrize("scheme", [QuantScheme("int8"), QuantScheme("w8a8"), QuantScheme("fp8"),
                                    QuantScheme("fp8", per_tensor=True), QuantScheme("int4", 128, symmetric=False)],
                         ids=QuantScheme.describe)
def test_a_float_weight_with_one_scale_a_row_is_rounded_whole_then_cut(scheme, monkeypatch):
    """quantization="int8"|"w8a8"|"fp8": each rank's scale is the row's, as at one rank, not its share's."""
    check_ranks(one_rank_layer(scheme, 64), monkeypatch, rounded_at_load=True)


def check_ranks(full: ReplicatedLinear, monkeypatch: pytest.MonkeyPatch,
                rounded_at_load: bool = False) -> list[RowParallelLinear]:
    """Both ranks' weights are exactly their columns of the whole one, and their products add up."""
    inputs = full.input_size
    whole = weight_of(full)
    x = torch.randn(3, inputs)
    ranks, partial = [], []
    for rank in (0, 1):
        layer = rank_layer(full, rank, monkeypatch, rounded_at_load)
        columns = slice(rank * inputs // 2, (rank + 1) * inputs // 2)
        assert torch.equal(weight_of(layer), whole[:, columns])  # the same codes, scales and zero points
        partial.append(layer.quant_method.apply(layer, x[:, columns], layer.bias if rank == 0 else None))
        ranks.append(layer)
    if full.quant_method.scheme.act_block(inputs) == inputs:  # w8a8: each rank scales its share of a token's inputs
        return ranks
    expected = full.quant_method.apply(full, x, full.bias)
    # int4 layers of 32-input groups (whole, or a rank's cut of wider ones) may round x to int16, each its own way
    rounding = 2 * int4_rounding_bound(x, whole) if full.quant_method.scheme.method == "int4" else 0.0
    torch.testing.assert_close(partial[0] + partial[1], expected, atol=1e-4 + rounding, rtol=1e-4)
    return ranks


def test_a_group_across_two_ranks_is_refused_naming_the_layer(monkeypatch):
    full = one_rank_layer(QuantScheme("int4", 128, symmetric=False), 192)  # 96 inputs a rank: not whole groups
    with pytest.raises(ValueError, match=r"tensor_parallel_size: model.layers.0.mlp.down_proj is quantized int4 g128 "
                                         r"asym: its 192 inputs across 2 ranks are 96 each, not whole groups of 128"):
        rank_layer(full, 0, monkeypatch)


def test_a_tensor_of_the_wrong_width_is_refused_naming_it(monkeypatch):
    full = one_rank_layer(QuantScheme("int8", 32), 128)
    full.scales = torch.nn.Parameter(full.scales[:, :3], requires_grad=False)  # one group short
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.down_proj.scales of shape \(24, 3\) does not split"):
        rank_layer(full, 1, monkeypatch)
