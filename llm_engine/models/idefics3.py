"""Idefics3 (and SmolVLM, its shape): a SigLIP-like vision tower, a pixel-shuffle connector and a
Llama decoder.

Every tile of a picture (see `multimodal/idefics3.py` for the splitting and the prompt layout)
goes through the tower; the connector folds each scale x scale block of patch states into one
vector (the pixel shuffle: scale^2 fewer, wider features) and projects it to the decoder's width.
Only the `<image>` positions of a picture's layout take these features; its tile markers are
ordinary tokens (`ImageItem.feature_mask`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import nn

from llm_engine.layers.attention import AttentionBackend
from llm_engine.models.llava import ImageTextModel
from llm_engine.models.vision import VisionEmbeddings, VisionTransformer
from llm_engine.multimodal.idefics3 import Idefics3ImageProcessor

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def bucketed_positions(rows: int, cols: int, side: int) -> torch.Tensor:
    """Position ids of a rows x cols patch grid on the tower's side x side table, by the
    fractional bucketing Transformers uses for variable sizes (with its float32 rounding: for
    some sides it is not simply 0..n-1)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    row_ids, col_ids = (
        torch.bucketize(torch.clamp(torch.arange(n, dtype=torch.float32) * (1.0 / torch.tensor(n)),
                                    max=1.0 - 1e-6), boundaries, right=True)
        for n in (rows, cols))
    return (row_ids[:, None] * side + col_ids[None, :]).flatten()


class Idefics3VisionEmbeddings(VisionEmbeddings):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config, class_token=False)
        self.side = config.image_size // config.patch_size

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        conv = self.patch_embedding
        patches = conv(pixels.to(conv.weight.dtype)).flatten(2).transpose(1, 2)
        rows, cols = pixels.shape[-2] // conv.stride[0], pixels.shape[-1] // conv.stride[1]
        out: torch.Tensor = patches + self.position_embedding(bucketed_positions(rows, cols, self.side).to(pixels.device))
        return out


class Idefics3Projection(nn.Module):
    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x)
        return out


class Idefics3Connector(nn.Module):
    def __init__(self, config: PretrainedConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.scale = config.scale_factor
        self.modality_projection = Idefics3Projection(config.vision_config.hidden_size * self.scale ** 2,
                                                      config.get_text_config().hidden_size, dtype)

    def pixel_shuffle(self, x: torch.Tensor) -> torch.Tensor:
        """[B, side^2, D] -> [B, (side / s)^2, D * s^2]: the same element order as Transformers'."""
        batch, tokens, dim = x.shape
        side, s = int(tokens ** 0.5), self.scale
        x = x.view(batch, side, side // s, dim * s).permute(0, 2, 1, 3)
        x = x.reshape(batch, side // s, side // s, dim * s * s).permute(0, 2, 1, 3)
        return x.reshape(batch, tokens // (s * s), dim * s * s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.modality_projection(self.pixel_shuffle(x))
        return out


class Idefics3ForConditionalGeneration(ImageTextModel):
    processor_class = Idefics3ImageProcessor
    checkpoint_renames = [(re.compile(r"^model\.text_model\."), "language_model.model."),
                          (re.compile(r"^lm_head\."), "language_model.lm_head."),
                          (re.compile(r"^model\.vision_model\."), "vision_tower."),
                          (re.compile(r"^model\.connector\."), "connector.")]

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__(config, backend, dtype)
        self.vision_tower = VisionTransformer(config.vision_config, -1, False, True, dtype)
        self.vision_tower.embeddings = Idefics3VisionEmbeddings(config.vision_config).to(dtype)
        self.connector = Idefics3Connector(config, dtype)

    @staticmethod
    def image_inputs(config: PretrainedConfig, processor: Idefics3ImageProcessor, image: Image.Image,
                     num_images: int) -> tuple[torch.Tensor, list[int]]:
        vision = config.vision_config
        if processor.tile != vision.image_size:
            raise ValueError(f"model: the preprocessor makes {processor.tile} px tiles but the vision tower "
                             f"takes {vision.image_size} px")
        tiles, rows, cols = processor.tiles(image)
        features = (vision.image_size // vision.patch_size) ** 2 // config.scale_factor ** 2
        return processor.pixels(tiles), processor.placeholders(rows, cols, features)

    def encode_image(self, pixels: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """Tiles [n, 3, S, S] -> the features of their `<image>` positions [n * per tile, hidden]."""
        states = self.vision_tower(pixels.to(self.connector.modality_projection.proj.weight.dtype))
        features: torch.Tensor = self.connector(states)
        return features.reshape(-1, features.shape[-1])
