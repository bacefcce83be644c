"""LLaVA: a CLIP (or SigLIP) vision tower, a two-layer projector, and a Llama/Mistral/Qwen2
decoder whose image placeholder tokens take the projected image features as embeddings.

The engine computes each image's features once (`encode_image`, cached by the image's hash) and
passes the rows that belong to image placeholders with each step (`mm_embeds`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import nn

from llm_engine.layers.attention import AttentionBackend
from llm_engine.models.llama import LlamaForCausalLM, _copy_loader
from llm_engine.models.qwen2 import Qwen2ForCausalLM
from llm_engine.models.vision import VisionTransformer, activation
from llm_engine.multimodal.processor import ImageProcessor

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TEXT_MODELS: dict[str, type[LlamaForCausalLM]] = {"llama": LlamaForCausalLM, "mistral": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}


def text_model_class(config: PretrainedConfig) -> type[LlamaForCausalLM]:
    text = config.get_text_config()
    if text.model_type not in TEXT_MODELS:
        raise ValueError(f"model: language model type {text.model_type!r} is not supported; "
                         f"supported: {sorted(TEXT_MODELS)}")
    return TEXT_MODELS[text.model_type]


def vision_tower(config: PretrainedConfig, dtype: torch.dtype, final_norm: bool = False) -> VisionTransformer:
    vision = config.vision_config
    if vision.model_type not in ("clip_vision_model", "siglip_vision_model"):
        raise ValueError(f"model: vision tower {vision.model_type!r} is not supported (CLIP or SigLIP)")
    layer = getattr(config, "vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise ValueError("model: several vision_feature_layer values are not supported")
    return VisionTransformer(vision, layer, vision.model_type == "clip_vision_model", final_norm, dtype)


def tile_features(config: PretrainedConfig) -> int:
    """How many features the projector makes of one picture (tile) at the tower's resolution."""
    vision = config.vision_config
    count = int((vision.image_size // vision.patch_size) ** 2)
    if vision.model_type == "clip_vision_model" and config.vision_feature_select_strategy == "full":
        count += 1
    return count


class LlavaProjector(nn.Module):
    def __init__(self, config: PretrainedConfig, dtype: torch.dtype) -> None:
        super().__init__()
        text_hidden, bias = config.get_text_config().hidden_size, getattr(config, "multimodal_projector_bias", True)
        self.linear_1 = nn.Linear(config.vision_config.hidden_size, text_hidden, bias=bias, dtype=dtype)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias, dtype=dtype)
        self.act = activation(config.projector_hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear_2(self.act(self.linear_1(x)))
        return out


class ImageTextModel(nn.Module):
    """What every vision-language model here shares: a decoder whose image rows take the image
    features as embeddings (`forward`), and loading a checkpoint whose tensor names
    `checkpoint_renames` maps to ours. Subclasses add the vision tower and its connector."""

    checkpoint_renames: list[tuple[re.Pattern[str], str]] = []
    vision_tower: VisionTransformer

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.image_token_id = config.image_token_id
        self.language_model = text_model_class(config)(config.get_text_config(), backend, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`mm_embeds`: (rows, embeddings) that replace the token embeddings of those rows."""
        decoder = self.language_model.model
        embeds: torch.Tensor = decoder.embed_tokens(input_ids)
        if mm_embeds is not None:
            rows, values = mm_embeds
            embeds[rows] = values.to(embeds.dtype)
        hidden: torch.Tensor = decoder(input_ids, positions, metadata, inputs_embeds=embeds)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Language-model tensors go to the decoder's loader; vision tensors of layers past the
        feature layer (and the unused final norm / pooling head) are skipped."""
        params = dict(self.named_parameters(remove_duplicate=False))
        depth = len(self.vision_tower.encoder.layers)
        loaded: set[str] = set()

        def text_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                for pattern, replacement in self.checkpoint_renames:
                    name = pattern.sub(replacement, name)
                if name.startswith("language_model."):
                    yield name.removeprefix("language_model."), tensor
                elif name in params:
                    _copy_loader(params[name], tensor)
                    loaded.add(name)
                elif not self._unused_vision_tensor(name, depth):
                    raise ValueError(f"model: checkpoint tensor {name!r} has no matching parameter")

        self.language_model.load_weights(text_weights())
        missing = sorted(n for n in params if not n.startswith("language_model.") and n not in loaded)
        if missing:
            raise ValueError(f"model: checkpoint lacks weights for {missing[:5]}")

    @staticmethod
    def _unused_vision_tensor(name: str, depth: int) -> bool:
        if not name.startswith("vision_tower."):
            return False
        layer = re.match(r"vision_tower\.encoder\.layers\.(\d+)\.", name)
        return (layer is not None and int(layer.group(1)) >= depth) or any(
            part in name for part in ("post_layernorm", ".head.", "position_ids"))


class LlavaForConditionalGeneration(ImageTextModel):
    # Checkpoint name forms (Hugging Face hub files, and what transformers 5 writes) -> ours.
    checkpoint_renames = [(re.compile(r"^model\.language_model\."), "language_model.model."),
                          (re.compile(r"^lm_head\."), "language_model.lm_head."),
                          (re.compile(r"^model\.(vision_tower|multi_modal_projector|image_newline)"), r"\1"),
                          (re.compile(r"^vision_tower\.vision_model\."), "vision_tower.")]

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__(config, backend, dtype)
        self.vision_tower = vision_tower(config, dtype)
        self.multi_modal_projector = LlavaProjector(config, dtype)
        self.skip_class_token = (config.vision_feature_select_strategy == "default"
                                 and self.vision_tower.embeddings.class_embedding is not None)

    @staticmethod
    def image_inputs(config: PretrainedConfig, processor: ImageProcessor, image: Image.Image,
                     num_images: int) -> tuple[torch.Tensor, list[int]]:
        """An upright RGB picture -> (pixel values [3, H, W], its placeholder token ids)."""
        pixels = processor(image)
        vision = config.vision_config
        if pixels.shape[1:] != (vision.image_size, vision.image_size):
            raise ValueError(f"model: the preprocessor makes {tuple(pixels.shape[1:])} pixels but the vision "
                             f"tower takes {vision.image_size}x{vision.image_size}")
        return pixels, [config.image_token_id] * tile_features(config)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> projected patch features [B, patches, text hidden]."""
        features = self.vision_tower(pixels.to(self.multi_modal_projector.linear_1.weight.dtype))
        if self.skip_class_token:
            features = features[:, 1:]
        projected: torch.Tensor = self.multi_modal_projector(features)
        return projected

    def encode_image(self, pixels: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """One image's placeholder embeddings [tokens, text hidden]."""
        return self.image_features(pixels.unsqueeze(0))[0]
