"""Model classes keyed by config.json `architectures`; plugins add more through the
`llm_engine.models` entry-point group (name = architecture, value = "module:Class")."""

from __future__ import annotations

from importlib.metadata import entry_points

from torch import nn

from llm_engine.models.llama import LlamaForCausalLM
from llm_engine.models.llava import LlavaForConditionalGeneration
from llm_engine.models.llava_next import LlavaNextForConditionalGeneration
from llm_engine.models.llava_onevision import LlavaOnevisionForConditionalGeneration
from llm_engine.models.qwen2 import Qwen2ForCausalLM
from llm_engine.models.qwen3 import Qwen3ForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "LlavaNextForConditionalGeneration": LlavaNextForConditionalGeneration,
    "LlavaOnevisionForConditionalGeneration": LlavaOnevisionForConditionalGeneration,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def register_model(architecture: str, model_class: type[nn.Module]) -> None:
    _MODELS[architecture] = model_class


def supported_architectures() -> list[str]:
    _load_plugins()
    return sorted(_MODELS)


def resolve_model_class(architectures: list[str] | None) -> type[nn.Module]:
    _load_plugins()
    for arch in architectures or []:
        if arch in _MODELS:
            return _MODELS[arch]
    raise ValueError(f"model: architectures {architectures} not supported; "
                     f"supported: {sorted(_MODELS)}")


def _load_plugins() -> None:
    for entry in entry_points(group="llm_engine.models"):
        if entry.name not in _MODELS:
            _MODELS[entry.name] = entry.load()
