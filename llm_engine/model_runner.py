"""Owns the device: builds the model, loads its weights, holds the KV pool, runs steps, samples."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch

from llm_engine import gpu_memory
from llm_engine.autodeploy.engine_dir import check_engine_options, load_model
from llm_engine.config import EngineConfig
from llm_engine.cuda_graphs import DecodeGraphs, capture_sizes
from llm_engine.distributed import get_tp_size
from llm_engine.layers.attention import Attention, AttentionBackend, NativePagedAttention, SeqSlice, TorchPagedAttention
from llm_engine.layers.decode_stack import DecodeStack
from llm_engine.layers.embedding import VocabParallelEmbedding
from llm_engine.layers.linear import LinearBase, name_layers
from llm_engine.layers.native import KernelBuildError
from llm_engine.layers.quant_config import assign_quantization, summarize
from llm_engine.layers.quantization import decode_step, weight_bytes
from llm_engine.loader import ModelSource
from llm_engine.models.registry import resolve_model_class
from llm_engine.multimodal.encoder_cache import EncoderCache, ImageEncoder, step_image_embeddings
from llm_engine.sampler import Sampler, SampleResult
from llm_engine.sequence import Sequence

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
logger = logging.getLogger(__name__)


def cpu_has_fast_bf16() -> bool:
    """bfloat16 matmuls beat float32 only with native support (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(config: EngineConfig, hf_config: PretrainedConfig) -> torch.dtype:
    """'auto': on CPU bfloat16 where the CPU has native bf16, else float32; on GPUs the
    checkpoint's 16-bit dtype (bfloat16 by default). On such a CPU bf16 is also the choice for
    quantized models: their prefill-sized matmuls run on AMX in bf16, ~3x faster than in float32,
    and an inline completion's ~1,000-token prompt outweighs its few dozen tokens (1.67 vs 2.93
    CPU s for the built-in model), while a single sequence's decode steps still compute in float32
    (the fused step, layers/decode_stack.py, on the bf16 KV cache)."""
    if config.dtype != "auto":
        return _DTYPES[config.dtype]
    if config.device == "cpu":
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    checkpoint = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(checkpoint, str):
        checkpoint = _DTYPES.get(checkpoint)
    return checkpoint if checkpoint in (torch.float16, torch.bfloat16) else torch.bfloat16


def make_attention_backend(config: EngineConfig) -> AttentionBackend:
    """'auto' takes the Triton kernels on CUDA, and on the CPU the native kernel when it builds
    here, else the reference."""
    if config.attention_backend == "triton" or (config.attention_backend == "auto" and config.device != "cpu"):
        from llm_engine.layers.attention_triton import TritonPagedAttention  # imports triton: only when used

        return TritonPagedAttention()
    if config.attention_backend == "torch":
        return TorchPagedAttention()
    try:
        return NativePagedAttention()
    except KernelBuildError as exc:
        if config.attention_backend == "native":
            raise ValueError(f"attention_backend: the native kernel is unavailable: {exc}") from exc
        logger.warning("native attention kernel unavailable, using the PyTorch reference: %s", exc)
        return TorchPagedAttention()


@dataclass
class StepInput:
    """One step's model inputs as plain data, so it can be sent to tensor-parallel workers."""

    input_ids: list[int]
    positions: list[int]
    slices: list[SeqSlice]
    logit_rows: list[int]  # rows whose logits are sampled
    prompt_rows: list[tuple[int, int, int, int]]  # (scheduled index, start, first row, rows)
    block_copies: list[tuple[int, int]]
    mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, image features)


def prepare_step(scheduled: list[tuple[Sequence, int]], block_copies: list[tuple[int, int]]) -> StepInput:
    step = StepInput([], [], [], [], [], block_copies)
    for index, (seq, num_new) in enumerate(scheduled):
        start = seq.num_computed_tokens
        if seq.request.needs_prompt_logits:
            predicting = min(start + num_new, seq.num_prompt_tokens - 1) - start
            if predicting > 0:
                step.prompt_rows.append((index, start, len(step.input_ids), predicting))
        tokens = seq.step_token_ids
        step.input_ids.extend(tokens[start:start + num_new])
        step.positions.extend(range(start, start + num_new))
        verifies = bool(seq.spec_token_ids) and num_new == 1 + len(seq.spec_token_ids) == len(tokens) - start
        step.slices.append(SeqSlice(start, num_new, seq.block_table, as_decodes=verifies))
        if start + num_new == len(tokens):  # the last token's logits, and each draft token's
            step.logit_rows.extend(range(len(step.input_ids) - 1 - len(seq.spec_token_ids), len(step.input_ids)))
    return step


def check_cuda_device(device: torch.device) -> None:
    """A clear error for a CUDA device this machine does not have."""
    if not torch.cuda.is_available():
        raise ValueError(f"device: {str(device)!r} requested but CUDA is not available "
                         f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device: {str(device)!r} requested but this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")


class CausalLM(Protocol):
    """The calls the runner makes on a registered model besides nn.Module's (which types them
    only as `Tensor | Module`)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...


class ModelRunner:
    def __init__(self, config: EngineConfig, hf_config: PretrainedConfig, source: ModelSource) -> None:
        self.device = torch.device(config.device)
        if self.device.type == "cuda":
            check_cuda_device(self.device)
            if self.device.index is None:  # "cuda": the current device, named (set_device needs an index)
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            used_before = gpu_memory.used_now(self.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.block_size = config.block_size
        self.backend = make_attention_backend(config)
        if source.engine is not None:  # built by `codeyard llm build`: transformed, loaded and quantized
            self.dtype = check_engine_options(config, source.engine)
            self.model, self.quantization = load_model(source.folder, self.backend, self.device), source.engine.quantization
        else:
            checkpoint, gguf_types = source.checkpoint_quant(hf_config), source.gguf_tensor_types()
            self.dtype = resolve_dtype(config, hf_config)
            model_class = resolve_model_class(getattr(hf_config, "architectures", None), config.model_impl)
            with torch.device(self.device):
                self.model = model_class(hf_config, self.backend, self.dtype)
            name_layers(self.model)
            self.quantization, keep = assign_quantization(self.model, config.quantization, gguf_types, checkpoint)
            self._lm.load_weights(source.weights(hf_config, keep, checkpoint))
        logger.info("quantization (%s): %s", config.quantization, summarize(self.quantization))
        for module in self.model.modules():
            if isinstance(module, LinearBase):
                module.quant_method.process_weights_after_loading(module)
            elif isinstance(module, VocabParallelEmbedding):  # the LM head too
                module.process_weights_after_loading()
        self.model.eval()
        self.weight_bytes = weight_bytes(self.model)
        self.vocab_size: int = hf_config.get_text_config().vocab_size
        self.max_model_len: int = min(config.max_model_len or hf_config.get_text_config().max_position_embeddings,
                                 hf_config.get_text_config().max_position_embeddings)
        self.sampler = Sampler(config.seed, self.device)
        self.graphs: DecodeGraphs | None = None
        self.decode_stack: DecodeStack | None = None
        if self.device.type == "cuda" and config.num_kv_blocks is None:
            num_blocks = self._profile_kv_blocks(config, used_before)
        else:  # the CPU's byte budget, or the blocks asked for
            assert isinstance(config.kv_cache_memory, int)  # parsed by EngineConfig.__post_init__
            num_blocks = config.num_kv_blocks or config.kv_cache_memory // get_tp_size() // self._bytes_per_block()
        # CUDA graphs pad batches with rows that write into one scratch block past the engine's pool
        use_graphs = self.device.type == "cuda" and not config.enforce_eager
        self.num_blocks = self._allocate_kv_cache(config, num_blocks, extra_blocks=int(use_graphs))
        # one sequence decoding runs the whole stack in one native call (None: layer by layer)
        self.decode_stack = DecodeStack.prepare(self.model, self.block_size) if self.device.type == "cpu" else None
        assert isinstance(config.encoder_cache_memory, int)  # as kv_cache_memory
        self.encoder_cache = EncoderCache(config.encoder_cache_memory)
        if use_graphs:
            self.graphs = self.decode_graphs(config)
            self.graphs.capture()

    @property
    def _lm(self) -> CausalLM:
        """The model, typed by the calls the runner makes on it."""
        return cast(CausalLM, self.model)

    def decode_graphs(self, config: EngineConfig) -> DecodeGraphs:
        """Static decode buffers over this runner's pool (captured only on CUDA, by the caller)."""
        max_len = min(self.max_model_len, self.num_blocks * self.block_size)
        return DecodeGraphs(self._logits, self.backend, capture_sizes(config.max_num_seqs),
                            -(-max_len // self.block_size), self.block_size, self.num_blocks, self.device)

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object) -> torch.Tensor:
        return self._lm.compute_logits(self.model(input_ids, positions, metadata))

    def _attention_layers(self) -> list[Attention]:
        return [m for m in self.model.modules() if isinstance(m, Attention)]

    def _bytes_per_block(self) -> int:
        layers = self._attention_layers()
        return (2 * len(layers) * self.block_size * layers[0].num_kv_heads * layers[0].head_dim
                * torch.tensor([], dtype=self.dtype).element_size())

    def profile_step(self, config: EngineConfig) -> int:
        """The largest step the scheduler can send, over a scratch pool: a prefill of
        max_num_batched_tokens tokens (as sequences no longer than the model allows), logits for up
        to max_num_seqs of them, and the sampler's sort of those rows (top-p's peak). Returns the
        scratch pool's size in bytes."""
        tokens = config.max_num_batched_tokens
        lengths = [min(self.max_model_len, tokens - start) for start in range(0, tokens, self.max_model_len)]
        blocks = [-(-length // self.block_size) for length in lengths]
        self._bind_kv_cache(torch.zeros(self._kv_shape(sum(blocks)), dtype=self.dtype, device=self.device))
        step = StepInput([0] * tokens, [p for length in lengths for p in range(length)], [], [], [], [])
        first = 0
        for length, count in zip(lengths, blocks):
            step.slices.append(SeqSlice(0, length, list(range(first, first + count))))
            first += count
        step.logit_rows = list(range(min(tokens, config.max_num_seqs)))
        logits, _ = self.run_step(step)
        logits.float().sort(dim=-1, descending=True)[0].softmax(dim=-1).cumsum(dim=-1)
        self._bind_kv_cache(torch.empty(0, dtype=self.dtype, device=self.device))
        return sum(blocks) * self._bytes_per_block()

    def _profile_kv_blocks(self, config: EngineConfig, used_before: int) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        scratch_bytes = self.profile_step(config)
        torch.cuda.empty_cache()
        profile = gpu_memory.measure(self.device, used_before, scratch_bytes)
        budget = gpu_memory.kv_cache_bytes(profile, config.gpu_memory_utilization)
        num_blocks = budget // self._bytes_per_block() - 1  # one for the graphs' scratch block
        if num_blocks < 1:
            raise ValueError(f"gpu_memory_utilization: {config.gpu_memory_utilization} leaves "
                             f"{budget} bytes for the KV cache, less than two blocks")
        logger.info("KV cache on %s: %d blocks (%.2f GiB; weights and activations peak at %.2f GiB)",
                    self.device, num_blocks, budget / 1024**3, profile.peak_torch / 1024**3)
        return num_blocks

    def _kv_shape(self, num_blocks: int) -> tuple[int, ...]:
        layers = self._attention_layers()
        return (2, len(layers), num_blocks, layers[0].num_kv_heads, self.block_size, layers[0].head_dim)

    def _bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        for i, layer in enumerate(self._attention_layers()):
            layer.k_cache, layer.v_cache = (kv_cache[0, i], kv_cache[1, i]) if kv_cache.numel() else (kv_cache, kv_cache)

    def _allocate_kv_cache(self, config: EngineConfig, num_blocks: int, extra_blocks: int = 0) -> int:
        """The pool of `num_blocks` blocks the engine hands out, plus `extra_blocks` it never sees."""
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory: {config.kv_cache_memory} bytes is less than one block "
                             f"({self._bytes_per_block()} bytes)")
        shape = self._kv_shape(num_blocks + extra_blocks)
        # a file: a prefill instance's pool, which decode instances map; a tensor-parallel rank's, which its engine maps
        self.kv_pool_path: Path | None = None
        kv_role = getattr(config.kv_transfer_config, "kv_role", None)
        if kv_role == "kv_producer" or (kv_role is not None and config.tensor_parallel_size > 1):
            from llm_engine.kv_connector import shared_kv_pool

            kv_cache, self.kv_pool_path = shared_kv_pool(shape, self.dtype)
        else:
            kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._bind_kv_cache(kv_cache)
        return num_blocks

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], block_copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor, list[tuple[Sequence, int, torch.Tensor]]]:
        """Run one forward pass. Returns logits for each sequence whose last token was computed,
        and for requests that want prompt logprobs (seq, first position, logits of the positions
        in this chunk whose next token is a prompt token)."""
        step = prepare_step(scheduled, block_copies)
        # only a vision model's requests carry images, so only such a model is asked to encode one
        step.mm_embeds = step_image_embeddings(cast(ImageEncoder, self.model), self.encoder_cache, scheduled, self.device)
        logits, prompt_logits = self.run_step(step)
        return logits, [(scheduled[index][0], start, chunk) for index, start, chunk in prompt_logits]

    @torch.inference_mode()
    def run_step(self, step: StepInput) -> tuple[torch.Tensor, list[tuple[int, int, torch.Tensor]]]:
        """The forward pass of a prepared step; prompt logits are keyed by the scheduled index.
        Tensor-parallel workers run this on every rank with the same `step`."""
        for src, dst in step.block_copies:
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
        if self.graphs is not None and (logits := self.graphs.run(step)) is not None:
            return logits, []
        decodes = all(s.num_new == 1 or s.as_decodes for s in step.slices)
        with decode_step(len(step.slices) if decodes else None):  # quantized layers pick kernels by it
            return self._forward(step, decodes)

    def _forward(self, step: StepInput, decodes: bool) -> tuple[torch.Tensor, list[tuple[int, int, torch.Tensor]]]:
        if (self.decode_stack is not None and step.mm_embeds is None
                and self.decode_stack.fits(len(step.slices), len(step.input_ids), len(step.logit_rows), decodes)):
            tables = [s.block_table for s in step.slices for _ in range(s.num_new)]
            hidden = self.decode_stack.rows(step.input_ids, step.positions, tables)
        else:
            metadata = self.backend.build_metadata(step.slices, self.block_size, self.device)
            extra = {} if step.mm_embeds is None else {"mm_embeds": step.mm_embeds}
            hidden = self.model(torch.tensor(step.input_ids, device=self.device),
                                torch.tensor(step.positions, device=self.device), metadata, **extra)
        prompt_logits = [(index, start, self._lm.compute_logits(hidden[row:row + count]))
                         for index, start, row, count in step.prompt_rows]
        if not step.logit_rows:  # only unfinished prompt chunks: no LM head (a quantized one's kernels take no 0 rows)
            return hidden.new_empty((0, self.vocab_size)), prompt_logits
        rows = torch.tensor(step.logit_rows, dtype=torch.long, device=self.device)
        return self._lm.compute_logits(hidden[rows]), prompt_logits

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: set[int]) -> list[SampleResult]:
        return self.sampler(logits, seqs, eos_token_ids)
