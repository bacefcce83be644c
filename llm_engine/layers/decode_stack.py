"""A decode step (one sequence's or a small batch's) through the whole decoder stack in one native call.

One stream decoding on the CPU spends most of its step in dispatch, not arithmetic: each of 30
layers makes ~10 Python module calls, each a few torch ops and a ctypes call. `DecodeStack`
describes the model's layers once (pointers to the packed weights, norms, KV pools, rotary
tables, in ctypes structures that live as long as the model) and each step passes only the tokens'
embeddings, their positions and block tables to csrc/decode_stack.cpp, which runs the same
kernels in the same order as the layers would. A step takes up to `MAX_TOKENS` tokens: the next
token and a speculative draft are verified in one pass over the weights, each token's hidden
state bit for bit the one a step of that token alone gives. A batch of up to `MAX_SEQUENCES`
sequences' next tokens goes through it too, each row with its own position and block table (the
decode instance of disaggregated serving runs 1-8 sequences a step on one core: 1.3-1.4x less CPU
a step than per layer at 3-8 rows, bf16 SmolLM2, one thread, load 9-13), where the layers' groups
are 32 inputs: with others a bf16 model's batch goes per layer, onto the AMX bf16 tiles (on a ~1B
int4 g128 model the fused 8-sequence step cost 2.2x bf16's). It applies to float32
and bfloat16 Llama-family models on one CPU rank whose linear layers are all weight-only quantized (the built-in
GGUF model's default); anything else keeps the per-layer path. A bfloat16 model (`dtype="auto"` on a
CPU with native bf16, the IDE's default) steps in float32 too, on its bf16 KV cache (keys, values
and queries rounded to bf16 as its layers round them; float32 copies of its norm weights, 137
KiB on the built-in model): its quantized kernels take float32 activations anyway, and its
layer-by-layer bf16 step cost ~1.6x the fused one's CPU time on the built-in model (26.2 vs 16.3
ms a token, one thread). The hidden states come back in bf16 for the LM head, as the per-layer
path's do. They differ from that path's by its per-op bf16 roundings, so a sequence decoding alone
(fused) and the same sequence in a larger batch or beside a prompt chunk (per layer) agree to bf16 rounding, not bit for bit (as 8-
and 9-sequence bf16 steps already do, which take different kernels); the fused step is the closer
to float32 (the built-in model's greedy tokens: 63 of 64 equal to float32's, the per-layer bf16
path's 6).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

from llm_engine.layers.attention import NativePagedAttention
from llm_engine.layers.native import KernelBuildError, load_kernels
from llm_engine.layers.quantization import AMX_BF16_MIN_DECODE_SEQUENCES, KERNEL_MAX_ROWS, WeightOnlyLinearMethod

logger = logging.getLogger(__name__)

_KINDS = {"int8": 0, "int4": 1, "fp8": 2}
_DTYPES = (torch.float32, torch.bfloat16)  # the model's; a step's arithmetic is float32 either way
# csrc/decode_stack.cpp's Phase order
PHASES = ("norms", "qkv", "rotary+kv write", "attention", "o_proj", "gate_up", "silu*up", "down")


class _QuantLinear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("act_block", ctypes.c_int32), ("n_out", ctypes.c_int64),
                ("k_in", ctypes.c_int64), ("group", ctypes.c_int64), ("qweight", ctypes.c_void_p),
                ("scales", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


class _DecodeLayer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv", _QuantLinear),
                ("o", _QuantLinear), ("gate_up", _QuantLinear), ("down", _QuantLinear),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class _DecodeModel(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int64), ("intermediate", ctypes.c_int64), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("block_size", ctypes.c_int32),
                ("num_layers", ctypes.c_int32), ("kv_bf16", ctypes.c_int32), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("final_norm", ctypes.c_void_p),
                ("layers", ctypes.POINTER(_DecodeLayer))]


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _quant_linear(layer: Any) -> _QuantLinear:
    method = layer.quant_method
    assert isinstance(method, WeightOnlyLinearMethod)
    return _QuantLinear(_KINDS[method.scheme.weights], method.scheme.act_block(layer.input_size) or 0,
                        layer.output_size, layer.input_size, method.group(layer), layer.qweight.data_ptr(),
                        layer.scales.data_ptr(), _pointer(getattr(layer, "offsets", None)), _pointer(layer.bias))


def unsupported_reason(model: Any, block_size: int) -> str | None:
    """Why `model` cannot run the fused decode step, or None if it can."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(model, "compute_logits"):
        return "not a Llama-family decoder"
    first = layers[0]
    attention = first.self_attn
    if attention.q_norm is not None:
        return "per-head q/k norms (Qwen3)"
    if not isinstance(attention.attn.backend, NativePagedAttention):
        return "the attention backend is not the native one"
    if first.input_layernorm.weight.dtype not in _DTYPES or first.input_layernorm.weight.device.type != "cpu":
        return "not float32 or bfloat16 on the CPU"
    if attention.attn.k_cache.dtype not in _DTYPES:
        return f"a {attention.attn.k_cache.dtype} KV cache"
    for layer in layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            method = linear.quant_method
            if linear.tp_size > 1:
                return "tensor parallel"
            if not isinstance(method, WeightOnlyLinearMethod) or method.act_order or linear.kernels is None:
                return f"linear layers not all weight-only quantized ({type(method).__name__})"
    if attention.rotary_emb.kernels is None or block_size <= 0:
        return "no native kernels"
    return None


class DecodeStack:
    """The prepared decode step of one model (build with `DecodeStack.prepare`)."""

    MAX_TOKENS = KERNEL_MAX_ROWS  # tokens per step: the few-row matmul kernels take up to this many
    # sequences per batched step: the few-row kernel's one pass over the weights. Larger batches go
    # per layer, where a bf16 model's take the AMX tiles (on one core, 12 rows: 67.5 CPU ms fused
    # against 58.4 per layer; 8 rows: 30.7 against 56.3).
    MAX_SEQUENCES = AMX_BF16_MIN_DECODE_SEQUENCES

    def __init__(self, model: Any) -> None:
        inner = model.model
        first = inner.layers[0].self_attn
        self.dtype: torch.dtype = inner.norm.weight.dtype  # the hidden states' the LM head takes
        self._float: list[torch.Tensor] = []  # float32 copies of a bf16 model's norms and tables, kept alive

        def float32(t: torch.Tensor) -> int:
            if t.dtype != torch.float32:
                t = t.float()
                self._float.append(t)
            return t.data_ptr()

        layers = (_DecodeLayer * len(inner.layers))()
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            layers[i] = _DecodeLayer(float32(layer.input_layernorm.weight),
                                     float32(layer.post_attention_layernorm.weight),
                                     _quant_linear(attn.qkv_proj), _quant_linear(attn.o_proj),
                                     _quant_linear(mlp.gate_up_proj), _quant_linear(mlp.down_proj),
                                     attn.attn.k_cache.data_ptr(), attn.attn.v_cache.data_ptr())
        self._layers = layers  # kept alive: _model points into it
        # A batch of sequences fuses where every layer's few-row kernel makes one pass over the
        # weights for all rows (32-input groups); with other groups a bf16 model's per-layer path
        # puts 2-8 sequences on the AMX bf16 tiles, 1.1-3.4x less CPU per matmul (quantization.py).
        linears = [linear for layer in inner.layers for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        tiles = any(linear.quant_method.batch_takes_bf16_tiles(linear, self.dtype) for linear in linears)
        self.max_sequences = 1 if tiles else self.MAX_SEQUENCES
        self._model = _DecodeModel(inner.norm.weight.shape[0], inner.layers[0].mlp.down_proj.input_size,
                                   first.num_heads, first.num_kv_heads, first.head_dim,
                                   first.attn.k_cache.shape[2], len(inner.layers),
                                   int(first.attn.k_cache.dtype == torch.bfloat16), inner.norm.eps, first.attn.scale,
                                   float32(first.rotary_emb.cos), float32(first.rotary_emb.sin),
                                   float32(inner.norm.weight), layers)
        self._embed = inner.embed_tokens
        self._function = load_kernels().decode_stack_f32
        self.seconds = torch.zeros(len(PHASES), dtype=torch.float64)  # filled while `timing` is on
        self.timing = False

    @classmethod
    def prepare(cls, model: Any, block_size: int) -> DecodeStack | None:
        """The fused step for `model` once its weights and KV cache are in place, or None (logged why)."""
        reason = unsupported_reason(model, block_size)
        if reason is None:
            try:
                return cls(model)
            except KernelBuildError as exc:
                reason = str(exc)
        logger.info("single-sequence decode runs layer by layer: %s", reason)
        return None

    def fits(self, num_seqs: int, num_tokens: int, num_logit_rows: int, decodes: bool) -> bool:
        """A step of one sequence's next token, alone or with a draft to verify (every row's logits
        wanted), or of up to `max_sequences` sequences' that all decode (`decodes`: one token each,
        or drafts to verify, so a verified row is its sequence's plain fused step bit for bit);
        prompt chunks keep the per-layer path (causal SDPA over the chunk), and so do larger batches."""
        if num_seqs == 1:
            return num_tokens == 1 or num_logit_rows == num_tokens <= self.MAX_TOKENS
        return decodes and num_seqs <= self.max_sequences

    def __call__(self, token_ids: list[int], position: int, block_table: list[int]) -> torch.Tensor:
        """The final-normed hidden states [tokens, hidden] of one sequence's consecutive tokens from
        `position`, in the model's dtype."""
        return self.rows(token_ids, list(range(position, position + len(token_ids))), [block_table] * len(token_ids))

    def rows(self, token_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """The final-normed hidden states [rows, hidden] of tokens each at its own position in its own
        sequence's blocks (a batch's next tokens, or one sequence's run of them), in the model's dtype."""
        x: torch.Tensor = self._embed(torch.tensor(token_ids)).float().contiguous()
        num_blocks = max(positions) // self._model.block_size + 1
        flat: list[int] = []
        for table in block_tables:  # row t's table, cut or padded to num_blocks (read up to its position only)
            flat += table[:num_blocks]
            flat += [0] * (num_blocks - min(len(table), num_blocks))
        self._function(ctypes.byref(self._model), x.data_ptr(), len(token_ids), (ctypes.c_int64 * len(positions))(
            *positions), (ctypes.c_int32 * len(flat))(*flat), num_blocks, self.seconds.data_ptr() if self.timing else None)
        return x.to(self.dtype)
