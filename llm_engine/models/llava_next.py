"""LLaVA-NeXT (1.6): LLaVA with any-resolution tiling.

A picture becomes a low-resolution overview tile plus the tiles of its best grid resolution.
The grid tiles' features are laid out as one feature map, the padding the tiling added is cut
off again, and a learned `image_newline` ends every row; the overview's features come first.
The number of placeholders therefore depends on the picture's size (`num_features`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import nn

from llm_engine.layers.attention import AttentionBackend
from llm_engine.models.llava import LlavaForConditionalGeneration
from llm_engine.multimodal.processor import ImageProcessor, anyres_tiles, best_resolution

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def unpadded_size(height: int, width: int, rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) of a rows x cols feature map left after removing the padding a
    height x width picture got when it was fitted into the grid."""
    if width / height > cols / rows:
        new_rows = int(round(height * (cols / width), 7))
        return rows - 2 * ((rows - new_rows) // 2), cols
    new_cols = int(round(width * (rows / height), 7))
    return rows, cols - 2 * ((cols - new_cols) // 2)


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__(config, backend, dtype)
        self.image_newline = nn.Parameter(torch.zeros(config.get_text_config().hidden_size, dtype=dtype))

    @staticmethod
    def grid(config: PretrainedConfig, width: int, height: int) -> tuple[int, int, int]:
        """(tile rows, tile cols, features per tile side) for a width x height picture."""
        vision = config.vision_config
        grid_h, grid_w = best_resolution(height, width, config.image_grid_pinpoints)
        return grid_h // vision.image_size, grid_w // vision.image_size, vision.image_size // vision.patch_size

    @classmethod
    def feature_map_size(cls, config: PretrainedConfig, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the grid's feature map after unpadding."""
        tile_rows, tile_cols, side = cls.grid(config, width, height)
        return unpadded_size(height, width, tile_rows * side, tile_cols * side)

    @classmethod
    def num_features(cls, config: PretrainedConfig, width: int, height: int) -> int:
        side = config.vision_config.image_size // config.vision_config.patch_size
        rows, cols = cls.feature_map_size(config, width, height)
        return int(side * side + rows * (cols + 1))

    def shrink(self, grid: torch.Tensor) -> torch.Tensor:
        """A hook for a smaller feature map (LLaVA-OneVision); NeXT keeps it."""
        return grid

    @classmethod
    def image_inputs(cls, config: PretrainedConfig, processor: ImageProcessor, image: Image.Image,
                     num_images: int) -> tuple[torch.Tensor, list[int]]:
        if not processor.grid_pinpoints:
            raise ValueError("model: LLaVA-NeXT needs image_grid_pinpoints in preprocessor_config.json")
        count = cls.num_features(config, image.width, image.height)
        return anyres_tiles(processor, image), [config.image_token_id] * count

    def encode_image(self, pixels: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """Tiles [1 + rows * cols, 3, S, S] -> [overview features; unpadded grid rows + newline each]."""
        features = self.image_features(pixels)  # [tiles, side * side, hidden]
        width, height = image_size
        tile_rows, tile_cols, side = self.grid(self.config, width, height)
        hidden = features.shape[-1]
        grid = features[1:].view(tile_rows, tile_cols, side, side, hidden)
        grid = grid.permute(0, 2, 1, 3, 4).reshape(tile_rows * side, tile_cols * side, hidden)
        rows, cols = unpadded_size(height, width, tile_rows * side, tile_cols * side)
        top, left = (grid.shape[0] - rows) // 2, (grid.shape[1] - cols) // 2
        grid = self.shrink(grid[top:top + rows, left:left + cols])
        rows = grid.shape[0]
        newline = self.image_newline.to(grid.dtype).expand(rows, 1, hidden)
        return torch.cat([features[0], torch.cat([grid, newline], dim=1).reshape(-1, hidden)])
