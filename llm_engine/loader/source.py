"""Where a model lives: a Hugging Face folder (config.json + safetensors) or a .gguf file."""

from __future__ import annotations

from collections.abc import Iterator, Set
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from gguf import GGUFReader

from llm_engine.layers.quantization_formats import CheckpointQuant
from llm_engine.loader.engine_manifest import EngineManifest, is_engine_dir
from llm_engine.loader.gguf_conversion import config_and_tokenizer
from llm_engine.loader.gguf_weights import iter_gguf, tensor_types
from llm_engine.loader.quantized_checkpoint import read_checkpoint_quant, repack
from llm_engine.loader.safetensors_weights import iter_safetensors
from llm_engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


class ModelSource:
    def __init__(self, model: str, tokenizer: str | None = None) -> None:
        path = Path(model).expanduser()
        if not path.exists():
            raise ValueError(f"model: path {model!r} does not exist (only local models are loaded)")
        self.gguf_file: str | None = None
        self.engine = EngineManifest.read(path) if is_engine_dir(path) else None  # `codeyard llm build`'s output
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"model: {model!r} is a file but not a .gguf file")
            self.folder, self.gguf_file = path.parent, path.name
        else:
            self.folder = path
            ggufs = sorted(path.glob("*.gguf"))
            if not (path / "config.json").is_file():
                if len(ggufs) != 1:
                    raise ValueError(f"model: {model!r} has no config.json and not exactly one .gguf file")
                self.gguf_file = ggufs[0].name
        self.tokenizer_path = Path(tokenizer).expanduser() if tokenizer else self.folder

    def hf_config(self) -> PretrainedConfig:
        from transformers import AutoConfig

        if self.gguf_file is None:
            loaded: PretrainedConfig = AutoConfig.from_pretrained(self.folder, local_files_only=True)
            return loaded
        config = self._gguf_metadata[0]
        if not getattr(config, "architectures", None):
            arch = _GGUF_ARCHITECTURES.get(config.model_type)
            config.architectures = [arch] if arch else [config.model_type]
        return config

    def gguf_tensor_types(self) -> dict[str, str] | None:
        """{weight name: GGML block type} for a GGUF model, None for safetensors."""
        return None if self.gguf_file is None else tensor_types(self._gguf_reader)

    def checkpoint_quant(self, config: PretrainedConfig) -> CheckpointQuant | None:
        """An AWQ/GPTQ/fp8 checkpoint's quantization (config.json's quantization_config), else None."""
        return None if self.gguf_file is not None else read_checkpoint_quant(config, self.folder)

    def weights(self, config: PretrainedConfig, keep_quantized: Set[str] = frozenset(),
                checkpoint: CheckpointQuant | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors; GGUF weights named in `keep_quantized` come as their
        qweight/scales/offsets parts, and so do an AWQ/GPTQ/fp8 `checkpoint`'s, repacked."""
        if self.gguf_file is None:
            return iter_safetensors(self.folder) if checkpoint is None else repack(iter_safetensors(self.folder),
                                                                                   checkpoint)
        return iter_gguf(self._gguf_reader, config, keep_quantized)

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer from the same local files, or None when the folder has none."""
        from transformers import AutoTokenizer

        if self.gguf_file is not None and self.tokenizer_path == self.folder:
            tokenizer = self._gguf_metadata[1]
        elif not any((self.tokenizer_path / name).is_file() for name in _TOKENIZER_FILES):
            return None
        else:
            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)
        return cast(Tokenizer, tokenizer)  # a Hugging Face tokenizer, used one sequence at a time

    @cached_property
    def _gguf_metadata(self) -> tuple[PretrainedConfig, PreTrainedTokenizerBase]:
        """The GGUF's config and tokenizer, converted together (see gguf_conversion)."""
        assert self.gguf_file is not None
        return config_and_tokenizer(self.folder / self.gguf_file)

    @cached_property
    def _gguf_reader(self) -> GGUFReader:
        """One parse of the file's header for both the tensor types and the weights: the reader
        decodes every metadata field in Python, seconds for a large vocabulary."""
        assert self.gguf_file is not None
        return GGUFReader(str(self.folder / self.gguf_file))
