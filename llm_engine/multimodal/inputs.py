"""Images attached to a prompt: decoded, preprocessed, and given their placeholder positions.

A prompt carries one image placeholder token per image (LLaVA's `<image>`); each is expanded to
as many placeholders as the model has features for that image (Idefics3 adds tile-marker tokens
between them), so the image's features occupy prompt positions (and KV-cache blocks) like tokens do.
A model class may name its own `processor_class` (anything with `from_folder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from PIL import Image

from llm_engine.multimodal.image import ImageInputError, decode_image, image_hash, prepare_image
from llm_engine.multimodal.limits import ImageLimits
from llm_engine.multimodal.processor import ImageProcessor

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass
class ImageItem:
    hash: str  # content hash: keys the encoder cache and the prefix cache
    pixel_values: torch.Tensor
    image_size: tuple[int, int]  # (width, height) of the upright picture
    offset: int  # its first placeholder position in the prompt
    num_tokens: int  # positions it spans
    # which of them take image features (the others are layout tokens, such as Idefics3's tile
    # markers, embedded as text); None: all of them
    feature_mask: torch.Tensor | None = None


class VisionModelClass(Protocol):
    """A vision model's class: an image's pixel values and the token ids that stand for it in the
    prompt, which may depend on how many images the prompt has (LLaVA-OneVision)."""

    def image_inputs(self, config: Any, processor: Any, image: Image.Image,
                     num_images: int) -> tuple[torch.Tensor, list[int]]: ...


class ImageInputs:
    """Turns (prompt token ids, images) into the expanded prompt and its ImageItems for one model."""

    def __init__(self, hf_config: PretrainedConfig, model_class: VisionModelClass, folder: Path,
                 limits: ImageLimits = ImageLimits()) -> None:
        self.config = hf_config
        self.model_class = model_class
        self.processor = getattr(model_class, "processor_class", ImageProcessor).from_folder(folder)
        self.image_token_id = hf_config.image_token_id
        self.limits = limits

    def load(self, image: object) -> Image.Image:
        if isinstance(image, (bytes, bytearray, memoryview)):
            return decode_image(bytes(image), self.limits)
        return prepare_image(image, self.limits)

    def __call__(self, token_ids: list[int], images: Sequence[object]) -> tuple[list[int], list[ImageItem]]:
        places = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(places) != len(images):
            raise ImageInputError(f"prompt: {len(places)} image placeholder(s) for {len(images)} image(s); "
                                  f"put one image token (id {self.image_token_id}) where each image goes")
        expanded: list[int] = []
        items: list[ImageItem] = []
        last = 0
        for place, raw in zip(places, images):
            picture = self.load(raw)
            pixels, placeholders = self.model_class.image_inputs(self.config, self.processor, picture, len(images))
            expanded.extend(token_ids[last:place])
            # the pixels' shape in the key: the same picture preprocessed another way has other features
            key = f"{image_hash(picture)}:{'x'.join(map(str, pixels.shape))}"
            mask = torch.tensor(placeholders) == self.image_token_id
            items.append(ImageItem(key, pixels, picture.size, len(expanded), len(placeholders),
                                   None if bool(mask.all()) else mask))
            expanded.extend(placeholders)
            last = place + 1
        expanded.extend(token_ids[last:])
        return expanded, items


def block_extra_keys(items: list[ImageItem], start: int, end: int) -> tuple[tuple[str, int], ...]:
    """What besides token ids identifies positions [start, end): the images placed there."""
    return tuple((item.hash, max(start - item.offset, 0)) for item in items
                 if item.offset < end and start < item.offset + item.num_tokens)


@dataclass
class ImagePrompt:
    """A prompt already expanded and preprocessed (by a server, off the engine's thread)."""

    token_ids: list[int]
    items: list[ImageItem]


def fit_encoder_budget(items: list[ImageItem], start: int, num_new: int, remaining: int,
                       total: int) -> tuple[int, int]:
    """(tokens to schedule, image tokens whose encoding they start) for the chunk [start,
    start + num_new): it stops before the first image that no longer fits the step's encoder
    budget. The step's first image always fits (a larger one would otherwise never run)."""
    used = 0
    for item in items:
        if not start <= item.offset < start + num_new:
            continue
        if used + item.num_tokens > remaining and not (used == 0 and remaining == total):
            return item.offset - start, used
        used += item.num_tokens
    return num_new, used
