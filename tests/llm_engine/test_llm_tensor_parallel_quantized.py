"""Pre-quantized checkpoints at tensor_parallel_size=2 (`make test-llm-parallel`, CODEYARD_TP_MORE=1):
every layout the engine loads gives one rank's greedy tokens at two ranks (gloo, float32, random
tiny Llama/Qwen2 models quantized here): `codeyard llm quantize` int8 (per channel, its int8 tables),
int4 g32, fp8 (per tensor), calibrated gptq and awq; GPTQ act-order (desc_act, g_idx) with each
rank's columns regrouped; int8, fp8 and w8a8 rounded at load (scales of whole rows, w8a8's token
scales of whole tokens) and fp8 per tensor (the whole tensor's scale on every rank), their logprobs
within 1e-5 of one rank's. A layout whose group straddles two ranks is an error naming the layer.
The split itself, tensor by tensor, is test_row_shards.py (default suite). Each case starts a
worker group: ~10 s on an idle 2-core machine.
"""

from __future__ import annotations

import pytest
from conftest import build_tiny_model
from test_quant_awq_gptq import write_checkpoint
from test_quant_cli import tiny_llama_with_tokenizer  # noqa: F401 (fixture)
from tp_kit import assert_same, engines, mqa_llama, prompts, tokens_and_logprobs  # noqa: F401 (fixtures)

from llm_engine.calibration import default_calibration_files
from llm_engine.quantize import quantize_checkpoint

# --method, --group-size, the source model: what each case quantizes with `codeyard llm quantize`
QUANTIZED = {
    "int8-per-channel-mqa": ("int8", None, "mqa"),  # one scale per row: both ranks keep it; one KV head for two ranks
    "int4-g32": ("int4", 32, "llama"),
    "int4-g32-qwen2": ("int4", 32, "qwen2"),  # q/k/v biases, tied int8 tables
    "fp8-per-tensor": ("fp8", None, "llama"),
    "gptq-g32": ("gptq", 32, "calibrated"),
    "awq-g32": ("awq", 32, "calibrated"),
}


@pytest.fixture
def source(request, tmp_path):
    kind = QUANTIZED[request.param][2]
    if kind in ("mqa", "calibrated"):
        return request.getfixturevalue({"mqa": "mqa_llama", "calibrated": "tiny_llama_with_tokenizer"}[kind])
    return build_tiny_model({"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[kind], tmp_path / "float")


@pytest.mark.parametrize("source", QUANTIZED, indirect=True)
def test_quantize_outputs_give_one_ranks_tokens(request, source, tmp_path, engines):  # noqa: F811
    method, group, _ = QUANTIZED[request.node.callspec.id]
    calibration = tmp_path / "calibration.py"
    calibration.write_text(default_calibration_files()[-1].read_text()[:2000])
    out = tmp_path / "quantized"
    quantize_checkpoint(source, out, method, group, calibration=[calibration] if method in ("gptq", "awq") else None,
                        progress=lambda line: None)
    assert_tp2_matches(engines, out)


@pytest.mark.parametrize("group", [32, 64])
def test_gptq_act_order_gives_one_ranks_tokens(tmp_path, engines, group):  # noqa: F811
    """desc_act with shuffled g_idx: at two ranks each group's inputs are split unevenly."""
    write_checkpoint(tmp_path, "gptq", group=group, desc_act=True)
    one_rank = assert_tp2_matches(engines, tmp_path)
    assert one_rank.engine.model_runner.quantization["model.layers.0.mlp.down_proj"] == \
        f"gptq 4-bit g{group} act-order -> int4 g{group} asym"


# quantization= for a float checkpoint rounded at load: one scale a row, or one for the whole tensor
ROUNDED_AT_LOAD = {"int8": "int8", "fp8": "fp8", "w8a8": "w8a8",
                   "fp8-per-tensor": {"config_groups": {"all": {"targets": ["Linear", "Embedding"], "method": "fp8",
                                                                "strategy": "tensor"}}}}


@pytest.mark.parametrize("method", ROUNDED_AT_LOAD)
def test_rounded_at_load_with_one_scale_a_row_gives_one_ranks_tokens(mqa_llama, engines, method):  # noqa: F811
    """o_proj and down_proj are rounded whole, then cut, so their scales are one rank's (rounding each
    share gave fp8 another token on one prompt); w8a8's row-parallel layers scale a token's share by
    the whole token's absmax (all-reduced; each share's own gave logprobs 0.04-0.06 off); fp8 per
    tensor takes the whole tensor's absmax on column-parallel layers and the embedding too. Equal
    up to the all-reduce's summation order."""
    batch, quantization = prompts(), ROUNDED_AT_LOAD[method]
    ref = tokens_and_logprobs(engines(mqa_llama, quantization=quantization), batch)
    tp2 = tokens_and_logprobs(engines(mqa_llama, quantization=quantization, tensor_parallel_size=2), batch)
    assert_same(tp2, ref, atol=1e-5)


def test_a_group_across_two_ranks_is_an_error_naming_the_layer(tmp_path, engines):  # noqa: F811
    """GPTQ groups of 48: o_proj's 64 inputs (32 a rank) and down_proj's 128 (64 a rank) are not whole groups."""
    write_checkpoint(tmp_path, "gptq", group=48)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: model\.layers\.\d\.(self_attn\.o_proj|mlp\.down_proj) "
                                         r"is quantized int4 g48 asym: its (64|128) inputs across 2 ranks are (32|64) "
                                         r"each, not whole groups of 48"):
        engines(tmp_path, tensor_parallel_size=2)


def assert_tp2_matches(engines, folder):  # noqa: F811
    """One rank's tokens (and logprobs up to the all-reduce's summation order) at two; returns the one-rank LLM."""
    batch = prompts()
    one_rank = engines(folder)
    ref = tokens_and_logprobs(one_rank, batch)
    assert_same(tokens_and_logprobs(engines(folder, tensor_parallel_size=2), batch), ref, atol=1e-3)
    return one_rank
