"""`codeyard llm build`: run capture, the passes, weight loading and quantization once and save
the result as an ENGINE_DIR (see engine_dir.py), with a line of progress per step and a report."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llm_engine.autodeploy.engine_dir import save_model
from llm_engine.autodeploy.sensitivity import calibration_files, calibration_tokens, measure_sensitivity
from llm_engine.autodeploy.tune import DtypeTrial, candidate_dtypes, choose_dtype, measure_dtypes
from llm_engine.layers.attention import AttentionBackend, TorchPagedAttention
from llm_engine.layers.linear import LinearBase
from llm_engine.layers.quant_config import METHODS, assign_quantization, summarize, validate
from llm_engine.layers.quantization import WeightOnlyLinearMethod
from llm_engine.loader import ModelSource
from llm_engine.loader.engine_manifest import DTYPES, MANIFEST, MODEL_FILE, TARGETS, is_engine_dir

_CALIBRATION = (4, 256)  # sequences x tokens for the sensitivity pass and the dtype trials
_DTYPE_BUDGET = 0.01  # --dtype auto without --accuracy-budget: perplexity within 1% of float32's


@dataclass
class BuildReport:
    seconds: float
    source_bytes: int
    engine_bytes: int
    passes: list[str]
    quantization: str
    choices: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [*(f"pass {line}" for line in self.passes), *(f"choice {line}" for line in self.choices),
                f"quantization: {self.quantization}",
                f"built in {self.seconds:.1f} s: source {self.source_bytes / 1e6:.1f} MB -> engine "
                f"{self.engine_bytes / 1e6:.1f} MB"]


def check_output(out: Path) -> None:
    """`out` must be new, empty, or an engine built before (replaced), and writable."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_engine_dir(out):
        raise ValueError(f"--out: {out} holds files and is not an engine folder; give a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".codeyard-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out: cannot write to {out} ({exc.strerror or exc})") from None


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def quantize_loaded(model: torch.nn.Module) -> None:
    """Quantize the layers that round float weights at load, and mark them as holding quantized
    tensors, so loading the engine only attaches the kernels. Float layers keep their weights as
    loaded: their prepacking (oneDNN's bf16 layout) is machine-specific and cheap."""
    for module in model.modules():
        if isinstance(module, LinearBase) and isinstance(module.quant_method, WeightOnlyLinearMethod):
            if not module.quant_method.prequantized:
                module.quant_method.process_weights_after_loading(module)
                module.quant_method.prequantized = True


def target_device(target: str) -> tuple[torch.device, AttentionBackend]:
    """The device an engine for `target` is built on, and the attention backend its layers are
    checked against there; a target this machine lacks is refused before anything is built."""
    if target not in TARGETS:
        raise ValueError(f"--target: must be one of {', '.join(TARGETS)}, got {target!r}")
    if target == "cpu":
        return torch.device("cpu"), TorchPagedAttention()
    if not torch.cuda.is_available():
        raise ValueError(f"--target cuda: this machine has no CUDA GPU (torch {torch.__version__}, CUDA build: "
                         f"{torch.version.cuda or 'none'}); build on the machine that will serve the engine, "
                         f"or use --target cpu")
    from llm_engine.layers.attention_triton import TritonPagedAttention  # imports triton: only when used

    return torch.device("cuda", torch.cuda.current_device()), TritonPagedAttention()


def parse_budget(value: str) -> float:
    """'1%' or '0.01' -> 0.01."""
    try:
        budget = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ValueError(f"--accuracy-budget: expected a perplexity increase such as 1% or 0.01, got {value!r}") from None
    if not 0 <= budget < 10:
        raise ValueError(f"--accuracy-budget: must be between 0% and 1000%, got {value!r}")
    return budget


@dataclass
class _Built:
    """One dtype's model after steps 2-4, with what was chosen for it."""

    model: torch.nn.Module
    quantization: dict[str, str]
    choices: list[str]
    sensitivity: dict[str, Any]


def build_engine(src: str, out: Path, dtype: str = "float32", quantization: str | dict[str, Any] | None = None,
                 accuracy_budget: float | None = None, calibration: list[Path] | None = None,
                 progress: Callable[[str], None] = print, target: str = "cpu") -> BuildReport:
    """Build `src` (a model folder or .gguf) into the engine folder `out`. With `accuracy_budget`,
    `quantization` (one method) applies only to the layers the sensitivity pass lets go. dtype
    "auto" builds each candidate dtype and keeps the fastest on this machine whose perplexity is
    within the budget (1% if none is given) of float32's (autodeploy/tune.py)."""
    start = time.perf_counter()
    if dtype not in (*DTYPES, "auto"):
        raise ValueError(f"--dtype: must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    validate(quantization)
    device, backend = target_device(target)
    if accuracy_budget is not None and quantization not in METHODS:
        raise ValueError(f"--accuracy-budget: needs --quantization set to one of {METHODS}, got {quantization!r}")
    files = calibration_files(calibration)
    source = ModelSource(src)
    if source.engine is not None:
        raise ValueError(f"SRC: {src} is already a built engine; give the checkpoint it came from")
    check_output(out)
    progress(f"[1/5] reading {src}")
    hf_config = source.hf_config()
    tokenizer = source.tokenizer()
    measured = dtype == "auto" or accuracy_budget is not None
    windows = (calibration_tokens(files, tokenizer, hf_config.get_text_config().vocab_size, *_CALIBRATION)
               if measured else [])
    dtypes = candidate_dtypes(device) if dtype == "auto" else [dtype]
    built: dict[str, _Built] = {}
    trials: list[DtypeTrial] = []
    for candidate in dtypes:
        built[candidate] = _build_model(source, hf_config, candidate, quantization, accuracy_budget, windows,
                                        device, backend, progress)
    if dtype == "auto":
        progress(f"      timing {', '.join(dtypes)} in turns")
        trials = measure_dtypes({candidate: built[candidate].model for candidate in dtypes}, windows)
        for trial in trials:
            progress(f"      {trial.line()}")
    chosen = choose_dtype(trials, _DTYPE_BUDGET if accuracy_budget is None else accuracy_budget).dtype if trials else dtype
    result = built[chosen]
    choices = [*result.choices, *(t.line() for t in trials)] + ([f"dtype {chosen} (the fastest within the budget)"]
                                                                if trials else [])
    progress(f"[5/5] writing {out}")
    for stale in (MANIFEST, MODEL_FILE):  # a rebuild: the old engine is not one until the new is complete
        (out / stale).unlink(missing_ok=True)
    hf_config.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)  # type: ignore[attr-defined]  # a Hugging Face tokenizer
    for extra in ("generation_config.json", "chat_template.jinja"):
        if (source.folder / extra).is_file() and source.gguf_file is None:
            shutil.copy(source.folder / extra, out / extra)
    model = result.model
    report = BuildReport(0.0, _size(source.folder / source.gguf_file if source.gguf_file else source.folder), 0,
                         model.report, summarize(result.quantization), choices)  # type: ignore[arg-type]  # AutoDeployedCausalLM
    save_model(model, out, {"source": str(Path(src).resolve()), "target": target, "dtype": chosen,
                            "quantization": result.quantization, "sensitivity": result.sensitivity,
                            "dtype_trials": [vars(t) for t in trials], "passes": model.report})
    report.seconds, report.engine_bytes = time.perf_counter() - start, _size(out)
    return report


def _build_model(source: ModelSource, hf_config: Any, dtype: str, quantization: str | dict[str, Any] | None,
                 accuracy_budget: float | None, windows: list[list[int]], device: torch.device,
                 backend: AttentionBackend, progress: Callable[[str], None]) -> _Built:
    """Steps 2-4 for one dtype: capture and passes, weights (and the sensitivity pass), quantization."""
    from llm_engine.autodeploy.model import AutoDeployedCausalLM

    progress(f"[2/5] capturing with torch.export and running the passes ({dtype})")
    with device:
        model = AutoDeployedCausalLM(hf_config, backend, DTYPES[dtype])
    for line in model.report:
        progress(f"      {line}")
    progress("[3/5] loading weights")
    checkpoint = source.checkpoint_quant(hf_config)
    choices: list[str] = []
    sensitivity: dict[str, Any] = {}
    if accuracy_budget is not None:
        if checkpoint is not None:
            raise ValueError("--accuracy-budget: the checkpoint is already quantized; give a float checkpoint")
        assign_quantization(model, None, None)
        model.load_weights(source.weights(hf_config))
        progress(f"      measuring each layer's {quantization} sensitivity on {len(windows)} calibration windows")
        chosen = measure_sensitivity(model, str(quantization), windows, accuracy_budget)
        choices = chosen.lines()
        for line in choices:
            progress(f"      {line}")
        quantization = chosen.quantization()
        sensitivity = {"budget": accuracy_budget, "errors": chosen.errors, "kept": chosen.kept,
                       "perplexity": chosen.perplexity}
    effective, keep = assign_quantization(model, quantization, source.gguf_tensor_types(), checkpoint)
    model.load_weights(source.weights(hf_config, keep, checkpoint))
    progress(f"[4/5] quantizing ({summarize(effective)})")
    quantize_loaded(model)
    model.eval()
    return _Built(model, effective, choices, sensitivity)
