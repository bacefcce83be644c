"""A built engine's quantized row-parallel layer at two ranks (quantized_shards.row_share): each
rank's share holds exactly its columns of the one-rank layer's quantized weight, the ranks' partial
products add up to the one-rank product, and a group straddling two ranks is refused naming the
layer. (Greedy tokens of quantized engines at tensor_parallel_size=2 through the engine's workers:
test_engine_dir, `make test-autodeploy`.)"""

from __future__ import annotations

import pytest
import torch

import llm_engine.layers.linear as linear
from llm_engine.autodeploy.quantized_shards import row_share
from llm_engine.layers.linear import ReplicatedLinear, RowParallelLinear
from llm_engine.layers.quantization import QuantScheme, WeightOnlyLinearMethod, dequantize

OUT = 24


def one_rank_layer(scheme: QuantScheme, inputs: int) -> ReplicatedLinear:
    """A layer quantized from random float weights, as `llm build` saves it (prequantized)."""
    method = WeightOnlyLinearMethod(scheme)
    layer = ReplicatedLinear(inputs, OUT, bias=True, quant_method=method)
    torch.manual_seed(0)
    layer.weight.data.copy_(torch.randn(OUT, inputs))
    layer.bias.data.copy_(torch.randn(OUT))
    method.process_weights_after_loading(layer)
    method.prequantized = True
    return layer


def rank_layer(full: ReplicatedLinear, rank: int, monkeypatch: pytest.MonkeyPatch) -> RowParallelLinear:
    monkeypatch.setattr(linear, "get_tp_size", lambda: 2)
    monkeypatch.setattr(linear, "get_tp_rank", lambda: rank)
    layer = RowParallelLinear(full.input_size, OUT, True, torch.float32, full.quant_method)
    saved = dict(full.named_parameters())
    for name, param in layer.named_parameters():
        param.data.copy_(row_share(full, layer, name, saved[name], "model.layers.0.mlp.down_proj"))
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def weight_of(layer: torch.nn.Module) -> torch.Tensor:
    method = layer.quant_method
    return dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), method.group(layer))


@pytest.mark.parametrize(("scheme", "inputs"), [
    (QuantScheme("int8"), 128),  # per output channel: both ranks keep the row's scale
    (QuantScheme("int8", 32), 128),
    (QuantScheme("int4", 32, symmetric=False), 128),  # two groups per rank
    (QuantScheme("int4", 64), 256),
    (QuantScheme("int4", 128, symmetric=False), 64),  # one group wider than the row (the default g128, small layers)
    (QuantScheme("fp8", per_tensor=True), 128),
    (QuantScheme("w4a8", 32, symmetric=False), 128),
], ids=lambda value: value.describe() if isinstance(value, QuantScheme) else str(value))
def test_each_rank_holds_its_columns_of_the_quantized_weight(scheme, inputs, monkeypatch):
    full = one_rank_layer(scheme, inputs)
    whole = weight_of(full)
    x = torch.randn(3, inputs)
    partial = []
    for rank in (0, 1):
        layer = rank_layer(full, rank, monkeypatch)
        columns = slice(rank * inputs // 2, (rank + 1) * inputs // 2)
        assert torch.equal(weight_of(layer), whole[:, columns])  # the same codes, scales and zero points
        partial.append(layer.quant_method.apply(layer, x[:, columns], layer.bias if rank == 0 else None))
    expected = full.quant_method.apply(full, x, full.bias)
    torch.testing.assert_close(partial[0] + partial[1], expected, atol=1e-4, rtol=1e-4)


def test_a_group_across_two_ranks_is_refused_naming_the_layer(monkeypatch):
    full = one_rank_layer(QuantScheme("int4", 128, symmetric=False), 192)  # 96 inputs a rank: not whole groups
    with pytest.raises(ValueError, match=r"tensor_parallel_size: model.layers.0.mlp.down_proj is quantized int4 g128 "
                                         r"asym: its 192 inputs across 2 ranks are 96 each, not whole groups of 128"):
        rank_layer(full, 0, monkeypatch)
