"""A built engine on disk (ENGINE_DIR): the captured, transformed model with its weights already
loaded and quantized, so loading skips torch.export, the passes, checkpoint decoding and
quantization.

Layout: `model.pt` (torch.save of the whole AutoDeployedCausalLM: the FX graphs as their
generated code, the engine's modules, the tensors; read back memory-mapped), `config.json` and the
tokenizer files (so ModelSource reads it as any model folder), and the manifest
(loader/engine_manifest.py). Runtime handles are not saved: native kernel libraries are reloaded
on this machine and attention modules are bound to the runner's backend at load. Why a pickle and
not safetensors + a module list: the graph is code, and a pickle of a GraphModule is that code
plus its modules, so no second serializer has to be kept in step with the passes. The cost: an
engine is tied to the versions that built it (checked first, with a clear error) and must be
trusted like code (loading it runs pickle).

An engine is saved for one rank. With tensor_parallel_size > 1 each worker runs the sharding
passes on the loaded graphs (the plan is read off them as at capture) and every layer they
replace takes its rank's share of the saved tensor of the same name through its weight loader,
as from a checkpoint: one engine serves any rank count its heads divide by. Quantized layers keep
their packed tensors: column-parallel ones by their loaders' rows, row-parallel ones through
their loader too (layers/row_shards.py: codes by columns, scales and zero points by whole groups).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import fx

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, run_passes
from llm_engine.autodeploy.passes.sharding import shard_lm_head, shard_tensor_parallel
from llm_engine.config import EngineConfig
from llm_engine.distributed import get_tp_size
from llm_engine.layers.attention import Attention, AttentionBackend
from llm_engine.layers.linear import MergedColumnParallelLinear, name_layers
from llm_engine.layers.native import CpuKernels, cpu_kernels
from llm_engine.layers.quant_config import summarize
from llm_engine.loader.engine_manifest import MODEL_FILE, EngineManifest, write_manifest


def _reload_kernels() -> CpuKernels | None:
    return cpu_kernels()


def _unbound_backend() -> None:
    """An attention module's backend, until `load_model` binds the runner's."""
    return None


class _EnginePickler(pickle.Pickler):
    """Runtime handles (ctypes libraries in kernels and backends) are saved as how to get them again."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, CpuKernels):
            return _reload_kernels, ()
        if isinstance(obj, AttentionBackend):
            return _unbound_backend, ()
        return NotImplemented


class _PickleModule:
    """What torch.save needs of a pickle module, with the engine's pickler."""

    Pickler = _EnginePickler
    Unpickler = pickle.Unpickler
    dump, load = pickle.dump, pickle.load


def save_model(model: torch.nn.Module, folder: Path, manifest: dict[str, Any]) -> None:
    """Write the model, then its manifest (last: a folder without one is never taken for an engine)."""
    for module in model.modules():
        if isinstance(module, fx.GraphModule):  # re-traced at load by fx's own tracer, not export's
            module._tracer_cls, module._tracer_extras = None, {}
    buffer = io.BytesIO()
    torch.save(model, buffer, pickle_module=_PickleModule)
    (folder / MODEL_FILE).write_bytes(buffer.getbuffer())
    write_manifest(folder, manifest)


def load_model(folder: Path, backend: AttentionBackend, device: torch.device) -> torch.nn.Module:
    """The saved model on `device`, its attention bound to `backend`. On the CPU the tensors stay
    memory-mapped (pages read as first touched)."""
    model: torch.nn.Module = torch.load(folder / MODEL_FILE, map_location=device, weights_only=False,
                                        mmap=device.type == "cpu")
    if get_tp_size() > 1:
        _split_for_rank(model, backend, device, EngineManifest.read(folder).dtype)
    for module in model.modules():
        if isinstance(module, PagedAttention):
            module.check_backend(backend)
        if isinstance(module, Attention):
            module.backend = backend
    return model


def _split_for_rank(model: torch.nn.Module, backend: AttentionBackend, device: torch.device,
                    dtype: torch.dtype) -> None:
    """The one-rank engine's graphs sharded for this rank; each layer the passes made loads its
    share of the saved tensor of the same name (merged layers part by part, quantized row-parallel
    ones by whole groups)."""
    saved = dict(model.named_parameters(remove_duplicate=False))
    context = PassContext(backend, dtype, device)
    with torch.device(device):
        run_passes(model.get_submodule("body"), context, [shard_tensor_parallel])  # type: ignore[arg-type]  # GraphModules
        run_passes(model.get_submodule("head"), context, [shard_lm_head])  # type: ignore[arg-type]
    name_layers(model)
    owners = {f"{path}.{name}" if path else name: module for path, module in model.named_modules(remove_duplicate=False)
              for name, _ in module.named_parameters(recurse=False)}
    for name, param in model.named_parameters(remove_duplicate=False):
        if saved.get(name) is param:
            continue
        owner, loader = owners[name], param.weight_loader  # type: ignore[attr-defined]  # the parallel layers' loaders
        if isinstance(owner, MergedColumnParallelLinear):
            for shard, part in enumerate(saved[name].split_with_sizes(owner.output_sizes)):
                loader(param, part, shard)
        else:
            loader(param, saved[name])


def check_engine_options(config: EngineConfig, engine: EngineManifest) -> torch.dtype:
    """The dtype to run a built engine in: its own. Its target device, dtype and quantization are
    fixed at build, so asking for others is an error, not a silent rebuild."""
    device = torch.device(config.device).type
    if device != engine.target:
        raise ValueError(f"device: the engine was built for {engine.target} (`llm build --target {engine.target}`) and "
                         f"cannot run on {device}; load it with device={engine.target!r} on a machine that has one, "
                         f"or rebuild it with --target {device}")
    if config.dtype not in ("auto", str(engine.dtype).removeprefix("torch.")):
        raise ValueError(f"dtype: the engine was built in {engine.dtype}; load it with dtype 'auto' or rebuild it")
    if config.quantization != "auto":
        raise ValueError(f"quantization: an engine's quantization is chosen at build ({summarize(engine.quantization)}); "
                         f"load it with quantization 'auto' or rebuild it")
    return engine.dtype
