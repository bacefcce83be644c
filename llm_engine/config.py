"""Engine configuration: one validated dataclass shared by every component."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_engine.kv_connector import KVTransferConfig
    from llm_engine.speculative import SpeculativeConfig

_MEMORY_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
                 "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_DTYPES = ("auto", "float32", "float16", "bfloat16")
_POLICIES = ("fcfs", "priority")
_ATTENTION_BACKENDS = ("auto", "torch", "native", "triton")
_EXECUTOR_BACKENDS = ("mp", "ray")
_RAY_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_MODEL_IMPLS = ("native", "auto")


def parse_memory(value: int | str, field: str) -> int:
    """Accept bytes as an int or a string such as '512MiB' / '2GB'."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected bytes as int or a size like '512MiB', got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _MEMORY_UNITS:
            raise ValueError(f"{field}: expected bytes as int or a size like '512MiB', got {value!r}")
        size = int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{field}: must be positive, got {value!r}")
    return size


@dataclass
class EngineConfig:
    """Everything the engine needs to know before it loads a model.

    `kv_cache_memory` is the byte budget for the paged KV pool; `num_kv_blocks` overrides it
    (tests use it to force preemption with a pool of a few blocks). `attention_backend`: "torch"
    is the reference PyTorch attention, "native" the C++ CPU kernel, "triton" the GPU kernels
    (on the CPU only under the Triton interpreter, TRITON_INTERPRET=1), "auto" triton on CUDA,
    and on the CPU native when it builds (a C++ compiler is needed) and torch otherwise.
    `quantization`: "auto" keeps a
    GGUF file's Q4_0/Q4_1/Q8_0 weights quantized, None loads floats, "int8"/"int4" or a per-layer
    config quantize at load (see layers/quant_config.py). `encoder_cache_memory` bounds the
    vision models' cache of image features (LRU by the image's content hash).

    On CUDA the KV pool is sized as vLLM sizes it: `gpu_memory_utilization` is the fraction of the
    GPU's total memory the engine may use (weights, the activation peak of a profiled forward of
    `max_num_batched_tokens` tokens, and the pool gets the rest); `kv_cache_memory` is the CPU's
    budget, and `num_kv_blocks` overrides both. `enforce_eager` (vLLM's name) turns off the CUDA
    graphs captured for decode steps. `model_impl`: "native" runs a registered architecture's
    hand-written model and any other Transformers causal LM through AutoDeploy
    (llm_engine/autodeploy/); "auto" sends every model through AutoDeploy.
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    kv_cache_memory: int | str = "1GiB"
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    num_threads: int | None = None
    seed: int = 0
    tensor_parallel_size: int = 1
    attention_backend: str = "auto"
    quantization: str | dict[str, Any] | None = "auto"
    encoder_cache_memory: int | str = "256MiB"
    speculative_config: dict[str, Any] | SpeculativeConfig | None = None
    kv_transfer_config: dict[str, Any] | KVTransferConfig | None = None  # disaggregated prefill/decode
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    distributed_executor_backend: str = "mp"  # "ray": the ranks on a Ray cluster (llm_engine/ray_executor.py)
    ray_placement_strategy: str = "PACK"  # STRICT_SPREAD: every rank on a different Ray node
    model_impl: str = "native"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: a local folder or .gguf file path is required")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {_DTYPES}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device: must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len: must be positive, got {self.max_model_len!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks: must be positive, got {self.num_kv_blocks!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: must be positive, got {self.num_threads!r}")
        if self.scheduling_policy not in _POLICIES:
            raise ValueError(f"scheduling_policy: must be one of {_POLICIES}, got {self.scheduling_policy!r}")
        if self.model_impl not in _MODEL_IMPLS:
            raise ValueError(f"model_impl: must be one of {_MODEL_IMPLS}, got {self.model_impl!r}")
        if self.attention_backend not in _ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend: must be one of {_ATTENTION_BACKENDS}, "
                             f"got {self.attention_backend!r}")
        if self.attention_backend == "native" and self.device != "cpu":
            raise ValueError("attention_backend: 'native' is a CPU kernel; use 'torch' or 'auto' on CUDA")
        if self.attention_backend == "triton":
            from llm_engine.layers.attention_triton import check_runs_on  # imports triton: only when asked

            check_runs_on(self.device)
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: must be a fraction in (0, 1], got {utilization!r}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager: must be true or false, got {self.enforce_eager!r}")
        if self.distributed_executor_backend not in _EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend: must be one of {_EXECUTOR_BACKENDS}, "
                             f"got {self.distributed_executor_backend!r}")
        if self.ray_placement_strategy not in _RAY_PLACEMENT_STRATEGIES:
            raise ValueError(f"ray_placement_strategy: must be one of {_RAY_PLACEMENT_STRATEGIES}, "
                             f"got {self.ray_placement_strategy!r}")
        if self.distributed_executor_backend == "ray":
            if self.tensor_parallel_size == 1:
                raise ValueError("distributed_executor_backend: 'ray' places the ranks of tensor_parallel_size "
                                 "> 1; one rank runs in the engine's process")
            if importlib.util.find_spec("ray") is None:
                raise ValueError("distributed_executor_backend: 'ray' needs the ray package "
                                 "(pip install 'codeyard[ray]')")
        if self.tensor_parallel_size > 1 and self.device != "cpu":
            raise ValueError("tensor_parallel_size: more than 1 runs on the CPU (gloo) so far")
        self.kv_cache_memory = parse_memory(self.kv_cache_memory, "kv_cache_memory")
        self.encoder_cache_memory = parse_memory(self.encoder_cache_memory, "encoder_cache_memory")
        from llm_engine.layers.quant_config import validate  # imports torch: only when configuring

        validate(self.quantization)
        if self.speculative_config is not None:
            from llm_engine.speculative import SpeculativeConfig

            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
            if self.speculative_config.model and self.tensor_parallel_size > 1:
                raise ValueError("speculative_config: a draft model runs with tensor_parallel_size 1 so far")
        if self.kv_transfer_config is not None:
            from llm_engine.kv_connector import KVTransferConfig

            if self.device != "cpu":
                raise ValueError("kv_transfer_config: disaggregated serving runs on the CPU so far")
            if self.tensor_parallel_size > 1 and self.distributed_executor_backend != "mp":
                raise ValueError("kv_transfer_config: a tensor-parallel instance's ranks run as local processes "
                                 "(the engine maps their KV pools), not on Ray")
            self.kv_transfer_config = KVTransferConfig.from_dict(self.kv_transfer_config)
