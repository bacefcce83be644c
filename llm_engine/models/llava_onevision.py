"""LLaVA-OneVision: LLaVA-NeXT's tiling with a SigLIP tower and a Qwen2 decoder, where a feature
map larger than `anyres_max_N` tiles' worth is shrunk (bilinear) to about N tiles, so a big
picture costs at most ~N * tile features.

A prompt with several pictures gets them without tiles, as Transformers does: each is padded to
a square, encoded as one tile, and followed by one `image_newline`. The two layouts are told
apart by the tile count (one tile: several pictures), as Transformers' packing does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from PIL import Image

from llm_engine.models.llava import tile_features
from llm_engine.models.llava_next import LlavaNextForConditionalGeneration
from llm_engine.multimodal.processor import ImageProcessor, pad_to_square

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def max_tiles(config: PretrainedConfig) -> int:
    return int(config.vision_aspect_ratio.removeprefix("anyres_max_"))


def shrunk_size(rows: int, cols: int, side: int, tiles: int) -> tuple[int, int, float]:
    """(rows, cols, ratio) after shrinking a rows x cols map to about `tiles` side x side tiles."""
    ratio = math.sqrt(rows * cols / (tiles * side * side))
    if ratio > 1.1:
        return int(rows // ratio), int(cols // ratio), ratio
    return rows, cols, ratio


class LlavaOnevisionForConditionalGeneration(LlavaNextForConditionalGeneration):
    @classmethod
    def num_features(cls, config: PretrainedConfig, width: int, height: int) -> int:
        side = config.vision_config.image_size // config.vision_config.patch_size
        rows, cols, _ = shrunk_size(*cls.feature_map_size(config, width, height), side, max_tiles(config))
        return int(side * side + rows * (cols + 1))

    @classmethod
    def image_inputs(cls, config: PretrainedConfig, processor: ImageProcessor, image: Image.Image,
                     num_images: int) -> tuple[torch.Tensor, list[int]]:
        if num_images == 1:
            return super().image_inputs(config, processor, image, num_images)
        pixels = processor(pad_to_square(processor, image)).unsqueeze(0)
        return pixels, [config.image_token_id] * (tile_features(config) + 1)

    def encode_image(self, pixels: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        if pixels.shape[0] > 1:
            return super().encode_image(pixels, image_size)
        features = self.image_features(pixels)[0]
        return torch.cat([features, self.image_newline.to(features.dtype)[None]])

    def shrink(self, grid: torch.Tensor) -> torch.Tensor:
        side = self.config.vision_config.image_size // self.config.vision_config.patch_size
        rows, cols, ratio = shrunk_size(grid.shape[0], grid.shape[1], side, max_tiles(self.config))
        if ratio <= 1.1:
            return grid
        channels_first = grid.permute(2, 0, 1).unsqueeze(0)
        return F.interpolate(channels_first, [rows, cols], mode="bilinear")[0].permute(1, 2, 0)
