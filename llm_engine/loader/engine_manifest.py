"""The manifest of a built engine folder (`codeyard llm build`; llm_engine/autodeploy/engine_dir.py):
what built it and how, read before anything else so an engine this installation cannot load is
refused with the reason, not with a pickle error."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

MANIFEST = "codeyard_engine.json"
MODEL_FILE = "model.pt"
FORMAT = 3  # 2: attention and rotary modules take a layout flag; 3: the graph runs without the batch dimension
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TARGETS = ("cpu", "cuda")  # the device type an engine is built for (`llm build --target`)


def installed_versions() -> dict[str, str]:
    """What an engine depends on: its modules' code (codeyard) and how they pickle (torch, transformers)."""
    import transformers

    try:
        codeyard = version("codeyard")
    except PackageNotFoundError:
        codeyard = "0.0.0+source"
    return {"codeyard": codeyard, "torch": torch.__version__, "transformers": transformers.__version__}


def is_engine_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


def write_manifest(folder: Path, fields: dict[str, Any]) -> None:
    data = {"format": FORMAT, "versions": installed_versions(), **fields}
    (folder / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")


@dataclass
class EngineManifest:
    dtype: torch.dtype
    quantization: dict[str, str]  # module -> scheme or "float", as the build chose
    data: dict[str, Any]
    target: str = "cpu"

    @classmethod
    def read(cls, folder: Path) -> EngineManifest:
        """The manifest, refused (ValueError) when it is not one this installation can load."""
        try:
            data = json.loads((folder / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"model: {folder} has an unreadable {MANIFEST} ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ValueError(f"model: {folder} is an engine of format {found!r}; this codeyard reads format {FORMAT} "
                             f"(rebuild it with `codeyard llm build`)")
        built, here = data.get("versions") or {}, installed_versions()
        if built != here:
            differ = ", ".join(f"{k} {built.get(k)} (here {v})" for k, v in here.items() if built.get(k) != v)
            raise ValueError(f"model: the engine in {folder} was built with {differ}; rebuild it with "
                             f"`codeyard llm build` on this installation")
        if data.get("dtype") not in DTYPES or not (folder / MODEL_FILE).is_file():
            raise ValueError(f"model: the engine in {folder} is incomplete (no {MODEL_FILE} or dtype)")
        if data.get("target", "cpu") not in TARGETS:
            raise ValueError(f"model: the engine in {folder} is for target {data['target']!r}; this codeyard runs {TARGETS}")
        return cls(DTYPES[data["dtype"]], dict(data.get("quantization") or {}), data, data.get("target", "cpu"))

    def runtime_options(self) -> dict[str, Any]:
        """The `LLM` options measured on the machine (`llm tune`, `llm build --tune`: attention backend,
        threads, block size, token budget), except the thread count on one with another CPU count."""
        runtime = self.data.get("runtime") or {}
        options = dict(runtime.get("options") or {})
        if runtime.get("cpus") != os.cpu_count():
            options.pop("num_threads", None)
        return options


def tuned_options(model: str) -> dict[str, Any]:
    """What a built engine asks `LLM(model=ENGINE_DIR)` to run with unless the caller says
    otherwise; nothing for any other model."""
    return EngineManifest.read(Path(model)).runtime_options() if is_engine_dir(Path(model)) else {}
