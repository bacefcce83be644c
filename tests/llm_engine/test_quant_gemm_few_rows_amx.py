"""The AMX bf16 few-row kernel for a bfloat16 model's int4 g32 decode rows (csrc/quant_gemm.cpp's
int4_few_rows_bf16_amx, the fused decode step's kernel unless CODEYARD_FEW_ROWS_AMX=0): what it
computes (x and the dequantized weights rounded to bf16, float32 sums), that a row's result does not
depend on the rows beside it (a verified row must equal its one-token step), and that a fused bf16
step's drafted rows equal its one-token steps with it on."""

from __future__ import annotations

import pytest
import torch
from conftest import drafted_after_prefix

from llm_engine import LLM
from llm_engine.layers.native import load_kernels
from llm_engine.layers.quantization import dequantize, pack_int4

INT4_G32 = {"config_groups": {"all": {"targets": ["re:.*self_attn.*", "gate_proj", "up_proj", "down_proj"],
                                     "method": "int4", "group_size": 32, "symmetric": False}}}  # GGUF Q4_1's


def few_rows(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
             group: int = 32) -> torch.Tensor | None:
    rows, k_in = x.shape
    out = torch.full((rows, qweight.shape[0]), float("nan"))
    done = load_kernels().int4_few_rows_bf16_amx(x.data_ptr(), qweight.data_ptr(), scales.data_ptr(),
                                                  offsets.data_ptr(), out.data_ptr(), rows, qweight.shape[0],
                                                  k_in, group)
    return out if done else None


def layer(n_out: int, k_in: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n_out, k_in), generator=g)
    scales = (torch.rand(n_out, k_in // 32, generator=g) * 0.02 + 0.001).half()
    offsets = (-8 * scales.float() + torch.randn(n_out, k_in // 32, generator=g) * 1e-3).half()
    return pack_int4(codes, 32), scales, offsets


def available() -> bool:
    x = torch.zeros(1, 32)
    return few_rows(x, *layer(16, 32)) is not None


needs_amx = pytest.mark.skipif(not available(), reason="no AMX bf16 tiles in this CPU or build")


@needs_amx
@pytest.mark.parametrize("k_in", [32, 96, 576, 1536])  # 1, 3, 18, 48 groups (slices of 4: part of one, some)
def test_it_is_the_bf16_product_in_float32(k_in):
    qweight, scales, offsets = layer(48, k_in, seed=k_in)
    x = torch.randn(5, k_in, generator=torch.Generator().manual_seed(1))
    out = few_rows(x, qweight, scales, offsets)
    w = dequantize(qweight, scales, offsets, 32).bfloat16().double()
    expected = x.bfloat16().double() @ w.T
    assert out is not None
    torch.testing.assert_close(out.double(), expected, atol=1e-5 * expected.abs().max().item(), rtol=0)
    float_kernel = x @ dequantize(qweight, scales, offsets, 32).T  # the opt-in's change: ~bf16's rounding
    assert (out - float_kernel).abs().max() > 0


@needs_amx
def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    qweight, scales, offsets = layer(64, 576, seed=3)
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([few_rows(x[i:i + 1], qweight, scales, offsets) for i in range(20)])
    for rows in (2, 3, 8, 16, 17, 20):  # past 16 rows: another pass over the weights
        together = few_rows(x[:rows], qweight, scales, offsets)
        assert together is not None and torch.equal(together, alone[:rows]), rows


@needs_amx
def test_shapes_it_cannot_take_are_left_to_the_float_kernel():
    qweight, scales, offsets = layer(24, 64)  # 24 channels: not a multiple of 16
    assert few_rows(torch.zeros(2, 64), qweight, scales, offsets) is None
    qweight, scales, offsets = layer(16, 64)
    assert few_rows(torch.zeros(2, 64), qweight, scales, offsets, group=64) is None


@needs_amx
def test_a_bf16_fused_steps_drafted_rows_are_its_one_token_steps(tiny_llama, monkeypatch):
    monkeypatch.setenv("CODEYARD_FEW_ROWS_AMX", "1")
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", quantization=INT4_G32, kv_cache_memory="8MiB", block_size=4,
              enable_prefix_caching=False, num_threads=1)
    runner = llm.engine.model_runner
    stack, table = runner.decode_stack, list(range(12))
    assert stack is not None
    start = 17
    with torch.inference_mode():
        drafted, on, alone = drafted_after_prefix(stack, table, start)
        monkeypatch.setenv("CODEYARD_FEW_ROWS_AMX", "0")
        off = stack(drafted, start, table)
    assert torch.equal(on, alone)
    assert not torch.equal(on, off)  # the tiles did run (their bf16 roundings differ from float32's)
    torch.testing.assert_close(on.float(), off.float(), atol=0.1, rtol=0.02)
