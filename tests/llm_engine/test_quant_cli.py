"""`codeyard llm quantize`: a tiny random Llama quantized by the command, loaded with `LLM`."""

from __future__ import annotations

import json

import pytest
import torch

from ide_server.cli import main
from llm_engine import LLM, SamplingParams
from llm_engine.layers.quantization import dequantize
from llm_engine.loader.safetensors_weights import iter_safetensors

PROMPTS = [list(range(3, 60, 2)), [7, 100, 200, 31, 5, 9, 250]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# --method: (checkpoint format the engine reports, --group-size, bound on |w - dequantized| in steps: half a
# step of rounding, up to one at a range's end, which can fall past the grid once the scale is rounded to float16)
METHODS = {"int8": ("gptq 8-bit", None, 1.01), "int4": ("gptq 4-bit g32", 32, 1.01),
           "gptq": ("gptq 4-bit g64", 64, 1.01), "awq": ("awq 4-bit g32", 32, 1.01), "fp8": ("fp8", None, None)}


def run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(["llm", *argv])
    return int(exit_info.value.code or 0)


@pytest.fixture(scope="module")
def float_tokens(tiny_llama) -> list[list[int]]:
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("method", METHODS)
def test_quantized_checkpoint_loads_close_to_float(tiny_llama, tmp_path, capsys, float_tokens, method):
    reported, group, steps = METHODS[method]
    out = tmp_path / "quantized"
    group_args = ["--group-size", str(group)] if group else []
    assert run_cli("quantize", str(tiny_llama), "--out", str(out), "--method", method, *group_args) == 0
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(progress) == 14 and progress[-1].startswith("[14/14] model.layers.1.")  # 2 layers x 7 projections

    llm = LLM(str(out), dtype="float32", num_kv_blocks=16)
    runner = llm.engine.model_runner
    assert runner.quantization["model.layers.1.mlp.down_proj"].startswith(reported)
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    float_weights = dict(iter_safetensors(tiny_llama))
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj"):
        layer = runner.model.get_submodule(name)
        w = float_weights[f"{name}.weight"]
        deq = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None),
                         layer.quant_method.group(layer))
        if steps is None:  # fp8 E4M3: 3 mantissa bits, half a unit of the last place
            assert bool(((deq - w).abs() <= w.abs() / 16 + layer.scales.float() / 512).all())
        else:
            step = layer.scales.float().repeat_interleave(layer.quant_method.group(layer), 1)[:, :w.shape[1]]
            assert bool(((deq - w).abs() <= step * steps + 1e-6).all())
    if method == "int8":
        assert tokens == float_tokens
    elif method == "fp8":
        assert [t[:4] for t in tokens] == [t[:4] for t in float_tokens]


def test_bad_input_is_one_line_and_exit_2(tiny_llama, tmp_path, capsys):
    quantized = tmp_path / "done"
    assert run_cli("quantize", str(tiny_llama), "--out", str(quantized), "--method", "int8") == 0
    capsys.readouterr()
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("x")
    cases = [
        ([str(tmp_path / "missing"), "--method", "int8"], "not a Hugging Face model folder"),
        ([str(tiny_llama), "--method", "int3"], "--method must be one of"),
        ([str(tiny_llama), "--method", "int4", "--group-size", "33"], "--group-size"),
        ([str(tiny_llama), "--method", "fp8", "--group-size", "32"], "no --group-size"),
        ([str(tiny_llama), "--method", "int4", "--out", str(occupied)], "not an empty folder"),
        ([str(quantized), "--method", "int4"], "already quantized"),
    ]
    for args, message in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "out")]
        assert run_cli("quantize", *args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (args, err)
    assert not (tmp_path / "out").exists()


def test_written_config_is_the_published_shape(tiny_llama, tmp_path):
    out = tmp_path / "awq"
    assert run_cli("quantize", str(tiny_llama), "--out", str(out), "--method", "awq", "--group-size", "32") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": 32,
                                             "zero_point": True, "version": "gemm"}
    tensors = dict(iter_safetensors(out))
    prefix = "model.layers.0.mlp.down_proj"  # 64 outputs, 128 inputs
    assert tensors[f"{prefix}.qweight"].shape == (128, 8) and tensors[f"{prefix}.qweight"].dtype == torch.int32
    assert tensors[f"{prefix}.qzeros"].shape == (4, 8) and tensors[f"{prefix}.scales"].shape == (4, 64)
    assert tensors[f"{prefix}.scales"].dtype == torch.float16 and f"{prefix}.weight" not in tensors
