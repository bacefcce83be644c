"""Model classes keyed by config.json `architectures`; plugins add more through the
`llm_engine.models` entry-point group (name = architecture, value = "module:Class")."""

from __future__ import annotations

from importlib.metadata import entry_points

from torch import nn

from llm_engine.models.idefics3 import Idefics3ForConditionalGeneration
from llm_engine.models.llama import LlamaForCausalLM
from llm_engine.models.llava import LlavaForConditionalGeneration
from llm_engine.models.llava_next import LlavaNextForConditionalGeneration
from llm_engine.models.llava_onevision import LlavaOnevisionForConditionalGeneration
from llm_engine.models.qwen2 import Qwen2ForCausalLM
from llm_engine.models.qwen3 import Qwen3ForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "Idefics3ForConditionalGeneration": Idefics3ForConditionalGeneration,
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


def resolve_model_class(architectures: list[str] | None, model_impl: str = "native") -> type[nn.Module]:
    """The hand-written class of a registered architecture; AutoDeploy's graph-built model for
    any other Transformers causal LM, or for every model with model_impl="auto"."""
    _load_plugins()
    if model_impl != "auto":
        for arch in architectures or []:
            if arch in _MODELS:
                return _MODELS[arch]
    if any(arch in _transformers_causal_lms() for arch in architectures or []):
        from llm_engine.autodeploy.model import AutoDeployedCausalLM  # imports transformers' modeling code

        return AutoDeployedCausalLM
    raise ValueError(f"model: architectures {architectures} not supported; supported: {sorted(_MODELS)} "
                     f"and Transformers' causal LMs (through AutoDeploy)")


def _transformers_causal_lms() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {name for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
            for name in ([names] if isinstance(names, str) else names)}


def _load_plugins() -> None:
    for entry in entry_points(group="llm_engine.models"):
        if entry.name not in _MODELS:
            _MODELS[entry.name] = entry.load()
