"""`codeyard llm quantize`: a tiny random Llama quantized by the command, loaded with `LLM`."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from conftest import build_tiny_model

from ide_server.cli import main
from llm_engine import LLM, SamplingParams
from llm_engine.calibration import default_calibration_files
from llm_engine.layers.quantization import dequantize
from llm_engine.layers.quantization_awq import output_error, rtn_dequantized, search_scales
from llm_engine.layers.quantization_formats import quantize_rtn, unpack_int32
from llm_engine.layers.quantization_gptq import gptq_quantize
from llm_engine.loader.safetensors_weights import iter_safetensors

PROMPTS = [list(range(3, 60, 2)), [7, 100, 200, 31, 5, 9, 250]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# --method: (checkpoint format the engine reports, --group-size, bound on |w - dequantized| in steps: half a
# step of rounding, up to one at a range's end, which can fall past the grid once the scale is rounded to float16)
METHODS = {"int8": ("gptq 8-bit", None, 1.01), "int4": ("gptq 4-bit g32", 32, 1.01), "fp8": ("fp8", None, None)}


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
    tables = ["model.embed_tokens", "lm_head"] if method != "fp8" else []  # int8 per row in GPTQ's layout
    total = 14 + len(tables)  # 2 layers x 7 projections, and the untied model's two tables
    assert len(progress) == total and progress[-1].startswith(f"[{total}/{total}] ")
    assert sorted(line.split()[1] for line in progress if line.endswith("-> int8 per row")) == sorted(tables)

    llm = LLM(str(out), dtype="float32", num_kv_blocks=16)
    runner = llm.engine.model_runner
    assert runner.quantization["model.layers.1.mlp.down_proj"].startswith(reported)
    for table in tables:
        assert runner.quantization[table] == "gptq 8-bit per-channel -> int8 per-channel"
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    float_weights = dict(iter_safetensors(tiny_llama))
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj", *tables):
        layer = runner.model.get_submodule(name)
        w = float_weights[f"{name}.weight"]
        deq = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None),
                         layer.quant_method.group(layer))
        if steps is None:  # fp8 E4M3: 3 mantissa bits, half a unit of the last place
            assert bool(((deq - w).abs() <= w.abs() / 16 + layer.scales.float() / 512).all())
        else:
            step = layer.scales.float().repeat_interleave(layer.quant_method.group(layer), 1)[:, :w.shape[1]]
            assert bool(((deq - w).abs() <= step * steps + 1e-6).all())
    if method == "int8":  # the random model has near ties: its int8 tables part from float at the 12th token
        assert [t[:8] for t in tokens] == [t[:8] for t in float_tokens]
    elif method == "fp8":
        assert [t[:4] for t in tokens] == [t[:4] for t in float_tokens]


def test_bad_input_is_one_line_and_exit_2(tiny_llama, tmp_path, capsys):  # gptq: further down
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
        ([str(tiny_llama), "--method", "int4", "--group-size", "96"], "not a multiple of the group size 96"),
        ([str(tiny_llama), "--method", "fp8", "--group-size", "32"], "no --group-size"),
        ([str(tiny_llama), "--method", "int4", "--out", str(occupied)], "not an empty folder"),
        ([str(quantized), "--method", "int4"], "already quantized"),
        ([str(tiny_llama), "--method", "gptq"], "needs the model's tokenizer"),
        ([str(tiny_llama), "--method", "int4", "--tables", "int4"], "--tables must be one of"),
        ([str(tiny_llama), "--method", "awq", "--tables", "int8"], "use --tables float"),
    ]
    for args, message in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "out")]
        assert run_cli("quantize", *args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (args, err)
    assert not (tmp_path / "out").exists()



def test_partial_groups_end_each_row_in_a_shorter_group(tiny_llama, tmp_path):
    out = tmp_path / "partial"
    assert run_cli("quantize", str(tiny_llama), "--out", str(out), "--method", "int4", "--group-size", "48",
                   "--partial-groups") == 0
    down = "model.layers.0.mlp.down_proj"  # 128 inputs: groups of 48, 48 and 32
    assert dict(iter_safetensors(out))[f"{down}.scales"].shape == (3, 64)
    layer = LLM(str(out), dtype="float32", num_kv_blocks=16).engine.model_runner.model.get_submodule(down)
    assert layer.quant_method.group(layer) == 48
    w = dict(iter_safetensors(tiny_llama))[f"{down}.weight"]
    deq = dequantize(layer.qweight, layer.scales, layer.offsets, 48)
    step = layer.scales.float().repeat_interleave(48, 1)[:, :128]
    assert bool(((deq - w).abs() <= step * 1.01 + 1e-6).all())

def test_gptq_rounding_moves_outputs_less_than_round_to_nearest():
    torch.manual_seed(0)
    k_in = 256
    w = torch.randn(96, k_in) * 0.05
    x = torch.randn(2048, k_in) @ (torch.eye(k_in) + 0.3 * torch.randn(k_in, k_in)) * torch.rand(k_in) * 3
    for group, symmetric, act_order in [(32, False, False), (64, True, True), (None, True, False)]:
        length = group or k_in
        codes, zeros, scales = quantize_rtn(w, 4, length, symmetric)
        rtn = (codes - zeros[torch.arange(k_in) // length]) * scales.float()[torch.arange(k_in) // length]
        codes, zeros, scales, g_idx = gptq_quantize(w, x.T @ x, 4, group, symmetric, act_order)
        if not act_order:
            assert torch.equal(g_idx, (torch.arange(k_in) // length).int())
        assert torch.equal(torch.bincount(g_idx).unique(), torch.tensor([length]))  # whole groups, any order
        gptq = (codes - zeros[g_idx.long()]) * scales.float()[g_idx.long()]
        error = {name: float((x @ (w.T - deq)).norm()) for name, deq in (("rtn", rtn), ("gptq", gptq))}
        assert error["gptq"] < 0.85 * error["rtn"], (group, error)


@pytest.fixture
def tiny_llama_with_tokenizer(tiny_llama, tmp_path):
    """The tiny Llama with a byte-level BPE tokenizer of its 320-token vocabulary, trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path / "with-tokenizer"
    shutil.copytree(tiny_llama, folder)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    text = default_calibration_files()[0].read_text()[:20000]
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>"],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_calibrated_methods_run_on_text_files(tiny_llama_with_tokenizer, tmp_path, capsys, method):
    calibration = tmp_path / "calibration.py"
    calibration.write_text(default_calibration_files()[-1].read_text()[:2000])
    out = tmp_path / method
    assert run_cli("quantize", str(tiny_llama_with_tokenizer), "--out", str(out), "--method", method,
                   "--group-size", "32", "--calibration", str(calibration)) == 0
    assert re.search(r"^calibrating on [1-9]\d* tokens$", capsys.readouterr().out, re.MULTILINE)
    tensors = dict(iter_safetensors(out))
    source = dict(iter_safetensors(tiny_llama_with_tokenizer))
    w = source["model.layers.0.mlp.down_proj.weight"]
    down = "model.layers.0.mlp.down_proj"
    if method == "gptq":
        assert config_of(out)["sym"] is False  # zero points, as round-to-nearest int4
        rtn_codes, _, _ = quantize_rtn(w, 4, 32, symmetric=False, min_zero=1)
        assert not torch.equal(unpack_int32(tensors[f"{down}.qweight"], 4, dim=0), rtn_codes)  # errors compensated
    else:  # scaled: the norm divides what the projections' columns multiply
        assert config_of(out) == {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                  "version": "gemm"}
        assert tensors[f"{down}.qweight"].shape == (128, 8) and tensors[f"{down}.qweight"].dtype == torch.int32
        assert tensors[f"{down}.qzeros"].shape == (4, 8) and tensors[f"{down}.scales"].shape == (4, 64)
        norm = "model.layers.0.input_layernorm.weight"
        assert not torch.equal(tensors[norm], source[norm])
    llm = LLM(str(out), dtype="float32", num_kv_blocks=16)
    assert llm.engine.model_runner.quantization[down].startswith(f"{method} 4-bit g32")
    assert len(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12
    assert run_cli("quantize", str(tiny_llama_with_tokenizer), "--out", str(tmp_path / "x"), "--method", method,
                   "--calibration", str(tmp_path / "missing.txt")) == 2
    assert run_cli("quantize", str(tiny_llama_with_tokenizer), "--out", str(tmp_path / "y"), "--method", "int8",
                   "--calibration", str(calibration)) == 2


def config_of(folder):
    return json.loads((folder / "config.json").read_text())["quantization_config"]


def test_awq_scales_protect_inputs_with_large_activations():
    torch.manual_seed(0)
    k_in = 256
    w = torch.randn(96, k_in) * 0.05
    x = torch.randn(2048, k_in) * torch.exp(torch.randn(k_in) * 1.5)  # a few inputs carry most of the signal
    moments = x.T @ x
    scales = search_scales([w[:48], w[48:]], moments, 4, 64)
    plain = output_error(w, rtn_dequantized(w, 4, 64), moments)
    scaled = output_error(w, rtn_dequantized(w * scales, 4, 64) / scales, moments)
    assert not torch.equal(scales, torch.ones(k_in)) and scaled < 0.8 * plain, (scaled, plain)


def test_a_tied_table_is_written_int8_beside_int4_layers_and_stays_packed(tmp_path, capsys):
    """A tied embedding (the LM head's table too) as GPTQ 8-bit per row, named in GPTQModel's
    `dynamic` overrides since the layers are 4-bit g32; loaded packed, the head tied to it; and
    --tables float leaves it float (a fifth of the bytes more here)."""
    source = build_tiny_model("Qwen2ForCausalLM", tmp_path / "tied")
    out, float_out = tmp_path / "int4", tmp_path / "int4-float-tables"
    assert run_cli("quantize", str(source), "--out", str(out), "--method", "int4", "--group-size", "32") == 0
    assert run_cli("quantize", str(source), "--out", str(float_out), "--method", "int4", "--group-size", "32",
                   "--tables", "float") == 0
    capsys.readouterr()
    quant = config_of(out)
    assert quant["dynamic"] == {r"+:model\.embed_tokens$": {"bits": 8, "group_size": -1, "sym": True, "desc_act": False}}
    assert "lm_head" not in quant and "dynamic" not in config_of(float_out)
    tensors = dict(iter_safetensors(out))
    assert "model.embed_tokens.weight" not in tensors and tensors["model.embed_tokens.qweight"].dtype == torch.int32
    llm = LLM(str(out), dtype="float32", num_kv_blocks=16)
    runner = llm.engine.model_runner
    assert runner.quantization["model.embed_tokens"] == "gptq 8-bit per-channel -> int8 per-channel"
    assert runner.quantization["lm_head"] == "tied to model.embed_tokens"
    assert runner.quantization["model.layers.0.mlp.down_proj"].startswith("gptq 4-bit g32")
    embedding = runner.model.get_submodule("model.embed_tokens")
    assert not hasattr(embedding, "weight") and embedding.qweight.dtype == torch.int8
    w = dict(iter_safetensors(source))["model.embed_tokens.weight"]
    step = embedding.scales.float()
    assert bool(((dequantize(embedding.qweight, embedding.scales, None, w.shape[1]) - w).abs() <= step).all())
    float_llm = LLM(str(float_out), dtype="float32", num_kv_blocks=16)
    assert "model.embed_tokens" not in float_llm.engine.model_runner.quantization
    tokens = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    float_tokens = float_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids[:4] for o in tokens] == [o.outputs[0].token_ids[:4] for o in float_tokens]


def test_malformed_dynamic_overrides_are_clear_errors(tiny_llama, tmp_path):
    out = tmp_path / "int4"
    assert run_cli("quantize", str(tiny_llama), "--out", str(out), "--method", "int4", "--group-size", "32") == 0
    config = json.loads((out / "config.json").read_text())
    for dynamic, message in [([], "must map module patterns"), ({"+:lm_head$": {"bits": 3}}, "with 3 bits"),
                             ({"+:(": {"bits": 8}}, "not a regular expression"),
                             ({"+:lm_head$": {"desc_act": True}}, "act-order per module")]:
        (out / "config.json").write_text(json.dumps({**config, "quantization_config": {
            **config["quantization_config"], "dynamic": dynamic}}))
        with pytest.raises(ValueError, match=re.escape(message)):
            LLM(str(out), dtype="float32", num_kv_blocks=16)
