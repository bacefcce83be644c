"""AWQ and GPTQ checkpoints: written here from a tiny random Llama by packing per the published
formats (AutoAWQ's WQLinear_GEMM, AutoGPTQ's QuantLinear), loaded by the engine kept packed, and
compared with a float model whose weights this file dequantizes from the same packed tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import COMMON, INT4_LOGPROB_ATOL, check_logprobs_close, hf_greedy, int4_rounds_activations
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig

from llm_engine import LLM, SamplingParams
from llm_engine.layers.quantization_formats import awq_pack, awq_unpack, pack_int32, unpack_int32

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Projections that read the same input share GPTQ's act-order (it comes from that input's statistics).
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROMPTS = [[5, 17, 33, 2, 9], [100, 4, 250, 7], list(range(40, 60))]  # 29 rows: the dequantizing prefill too


def rtn(w: np.ndarray, g_idx: np.ndarray, bits: int, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Min-max rounding of w [N, K] per group of inputs (g_idx): codes [K, N], zeros and float16 scales [G, N]."""
    maxq, groups = 2**bits - 1, int(g_idx.max()) + 1
    codes = np.zeros(w.shape[::-1], np.int64)
    zeros = np.zeros((groups, w.shape[0]), np.int64)
    scales = np.zeros((groups, w.shape[0]), np.float16)
    for g in range(groups):
        cols = w[:, g_idx == g]
        low, high = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
        if sym:
            s = (np.maximum(-low, high) * 2 / maxq).astype(np.float16)
            z = np.full(w.shape[0], (maxq + 1) // 2)
        else:
            s = ((high - low) / maxq).astype(np.float16)
            z = np.clip(np.round(-low / s.astype(np.float32)), 1, maxq).astype(np.int64)  # v1 stores z - 1 >= 0
        q = np.clip(np.round(cols / s.astype(np.float32)[:, None]) + z[:, None], 0, maxq)
        codes[g_idx == g] = q.T
        zeros[g], scales[g] = z, s
    return codes, zeros, scales


def words(values: list[np.ndarray], bits: int) -> np.ndarray:
    """values[i] goes to bits [bits*i, bits*(i+1)) of each uint32 word; returned as int32."""
    out = np.zeros(values[0].shape, np.uint32)
    for i, v in enumerate(values):
        out |= v.astype(np.uint32) << np.uint32(bits * i)
    return out.view(np.int32)


def awq_words(codes: np.ndarray) -> np.ndarray:
    """[R, N] -> [R, N/8]: word c's nibble i holds column 8c + AWQ_ORDER[i] (WQLinear_GEMM.pack)."""
    return words([codes[:, AWQ_ORDER[i]::8] for i in range(8)], 4)


def gptq_qweight(codes: np.ndarray, bits: int) -> np.ndarray:
    """[K, N] -> [K*bits/32, N]: row r's word holds inputs r*per .. r*per + per - 1 (QuantLinear.pack)."""
    per = 32 // bits
    return words([codes[i::per] for i in range(per)], bits)


def gptq_qzeros(zeros: np.ndarray, bits: int, stored_minus_one: bool) -> np.ndarray:
    per = 32 // bits
    stored = (zeros - 1 if stored_minus_one else zeros) & (2**bits - 1)
    return words([stored[:, i::per] for i in range(per)], bits)


def unpack_words(packed: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
    """The reference reading of `words`, interleaving the fields back along `axis`."""
    fields = [(packed.view(np.uint32) >> np.uint32(bits * i)) & np.uint32(2**bits - 1) for i in range(count)]
    return np.stack(fields, axis + 1).reshape(*packed.shape[:axis], -1, *packed.shape[axis + 1:]).astype(np.int64)


def reference_weight(method: str, parts: dict[str, np.ndarray], bits: int, group: int, k_in: int,
                     v2: bool, layout_rounding: bool) -> np.ndarray:
    """The float weight [N, K] the packed tensors stand for, read back from the words: w = (q - z) * s,
    or with `layout_rounding` q * s + float16(-z * s) (4 bits)."""
    if method == "awq":
        undo = np.argsort(AWQ_ORDER)
        codes = unpack_words(parts["qweight"], 4, 8, 1).reshape(k_in, -1, 8)[..., undo].reshape(k_in, -1)
        zeros = unpack_words(parts["qzeros"], 4, 8, 1).reshape(-1, codes.shape[1] // 8, 8)[..., undo]
        zeros = zeros.reshape(-1, codes.shape[1])
        g_idx = np.arange(k_in) // group
    else:
        codes = unpack_words(parts["qweight"], bits, 32 // bits, 0)
        zeros = unpack_words(parts["qzeros"], bits, 32 // bits, 1) + (0 if v2 else 1)
        g_idx = parts["g_idx"]
    scales = parts["scales"].astype(np.float32)
    if layout_rounding:  # the engine's layout keeps -z * s as a float16 offset
        offsets = (-zeros * scales).astype(np.float16).astype(np.float32)
        return (codes * scales[g_idx] + offsets[g_idx]).T.astype(np.float32)
    return ((codes - zeros[g_idx]) * scales[g_idx]).T.astype(np.float32)


def write_checkpoint(folder: Path, method: str, bits: int = 4, group: int = 32, sym: bool = False,
                     desc_act: bool = False, v2: bool = False
                     ) -> tuple[AutoModelForCausalLM, dict[str, torch.Tensor]]:
    """A tiny random Llama saved as an AWQ/GPTQ checkpoint; the float HF model of what it holds
    (with the layout's float16 offsets) and its exact (q - z) * s projection weights."""
    config = LlamaConfig(**COMMON, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = np.random.default_rng(7)
    tensors, perms, exact = {}, {}, {}
    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        projection = module.rpartition(".")[2]
        if projection not in PROJECTIONS:
            tensors[name] = tensor.contiguous()
            continue
        w = tensor.numpy()
        k_in = w.shape[1]
        group_len = k_in if group == -1 else group
        g_idx = np.arange(k_in) // group_len
        if desc_act:  # inputs quantized in a permuted order: each input's group follows that order
            key = (module.rpartition(".")[0], SHARED_INPUT.get(projection, projection))
            order = perms.setdefault(key, rng.permutation(k_in))
            g_idx = np.empty(k_in, np.int64)
            g_idx[order] = np.arange(k_in) // group_len
        codes, zeros, scales = rtn(w, g_idx, bits, sym)
        if method == "awq":
            parts = {"qweight": awq_words(codes), "qzeros": awq_words(zeros), "scales": scales}
        else:
            parts = {"qweight": gptq_qweight(codes, bits), "qzeros": gptq_qzeros(zeros, bits, not v2),
                     "scales": scales, "g_idx": g_idx.astype(np.int32)}
        tensors.update({f"{module}.{key}": torch.from_numpy(np.ascontiguousarray(v)) for key, v in parts.items()})
        exact[name] = torch.from_numpy(reference_weight(method, parts, bits, group_len, k_in, v2, False))
        model.get_parameter(name).data.copy_(torch.from_numpy(reference_weight(method, parts, bits, group_len,
                                                                               k_in, v2, bits == 4)))
    save_file(tensors, str(folder / "model.safetensors"))
    quant = {"quant_method": method, "bits": bits, "group_size": group}
    quant.update({"version": "gemm", "zero_point": True} if method == "awq" else
                 {"desc_act": desc_act, "sym": sym, "checkpoint_format": "gptq_v2" if v2 else "gptq"})
    (folder / "config.json").write_text(json.dumps({**config.to_dict(), "quantization_config": quant}))
    return model, exact


CASES = {
    "awq-g32": dict(method="awq"),
    "gptq-g32-sym": dict(method="gptq", sym=True),
    "gptq-g64-asym-act-order": dict(method="gptq", group=64, desc_act=True),
    "gptq-v2-g32-asym-act-order": dict(method="gptq", desc_act=True, v2=True),
    "gptq-8bit-per-channel": dict(method="gptq", bits=8, group=-1, sym=True),
}


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_matches_its_dequantized_float_model(tmp_path, case):
    spec = CASES[case]
    reference, exact = write_checkpoint(tmp_path, **spec)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=16)
    runner = llm.engine.model_runner
    assert runner.quantization["model.layers.0.mlp.down_proj"].startswith(spec["method"])
    assert not any(name.endswith(".weight") for name, _ in runner.model.model.layers.named_parameters()
                   if "proj" in name), "projections must stay packed"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    ours = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    # Same arithmetic up to summation order (and int16-rounded activations on int4 groups where the
    # kernel rounds them); the exact (q - z) * s differs by the float16 offsets.
    rounded = int4_rounds_activations() and spec.get("bits", 4) == 4
    check_logprobs_close(ours, hf_greedy(reference, PROMPTS, 8), atol=INT4_LOGPROB_ATOL if rounded else 1e-4)
    reference.load_state_dict(exact, strict=False)
    check_logprobs_close(ours, hf_greedy(reference, PROMPTS, 8), atol=1e-2)


def test_packers_match_the_published_bit_layouts():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (24, 40))
    assert np.array_equal(awq_pack(torch.from_numpy(codes)).numpy(), awq_words(codes))
    assert torch.equal(awq_unpack(torch.from_numpy(awq_words(codes))), torch.from_numpy(codes).int())
    for bits in (4, 8):
        wide = rng.integers(0, 2**bits, (32, 16))
        assert np.array_equal(pack_int32(torch.from_numpy(wide), bits, 0).numpy(), gptq_qweight(wide, bits))
        assert torch.equal(unpack_int32(torch.from_numpy(gptq_qweight(wide, bits)), bits, 0),
                           torch.from_numpy(wide).int())


def _edit_config(folder: Path, **quant) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(quant)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("edit,quantization,message", [
    ({}, "int4", "already quantized"),
    ({}, None, "already quantized"),
    ({}, "awq", "already quantized"),
    ({"quant_method": "bitsandbytes"}, "auto", "not supported"),
    ({"bits": 3}, "auto", "3 bits"),
    ({"group_size": 33}, "auto", "group_size"),
    ({"desc_act": False}, "auto", "desc_act is false"),
    ({"checkpoint_format": "marlin"}, "auto", "checkpoint_format"),
])
def test_bad_checkpoint_configs_are_clear_errors(tmp_path, edit, quantization, message):
    write_checkpoint(tmp_path, "gptq", desc_act=True)
    _edit_config(tmp_path, **edit)
    with pytest.raises(ValueError, match=message):
        LLM(str(tmp_path), dtype="float32", num_kv_blocks=4, quantization=quantization)


def test_awq_mode_needs_an_awq_checkpoint(tiny_llama):
    with pytest.raises(ValueError, match="needs a checkpoint"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=4, quantization="awq")


def test_fused_projections_must_share_their_act_order(tmp_path):
    from safetensors.torch import load_file

    write_checkpoint(tmp_path, "gptq", desc_act=True)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    attention = "model.layers.0.self_attn"
    tensors[f"{attention}.k_proj.g_idx"] = tensors[f"{attention}.o_proj.g_idx"].clone()  # another valid order
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="different input orders"):
        LLM(str(tmp_path), dtype="float32", num_kv_blocks=4)
