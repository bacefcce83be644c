"""Idefics3's (SmolVLM's) image splitting and prompt layout, with Transformers' arithmetic.

A picture is resized so that its longest edge is `size.longest_edge`, then up to whole tiles of
`max_image_size`; one larger than a tile is cut into rows x cols tiles (row-major) followed by
the whole picture squeezed into one tile (the global image). In the prompt each tile is
`<fake_token_around_image><row_r_col_c>` and its features, a row ends with a newline, and the
global image is `<fake_token_around_image><global-img>`, its features, `<fake_token_around_image>`.
The layout is written as text and tokenized by the model's own tokenizer, so newlines merge (or
not) exactly as in Transformers' processor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer

from llm_engine.multimodal.processor import ImageProcessor, image_processor_config

MAX_SIDE = 4096  # Transformers' cap on a resized picture's side
AROUND, GLOBAL = "<fake_token_around_image>", "<global-img>"


def longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge at `longest` (the other even), then capped at MAX_SIDE."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / aspect)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * aspect)
    return max(height, 1), max(width, 1)


def whole_tiles_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) rounded up to whole tiles, the longer side first."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


@dataclass
class Idefics3ImageProcessor:
    base: ImageProcessor  # resampling filter, rescale and normalisation
    longest_edge: int | None  # None: no first resize
    tile: int
    split: bool
    tokenizer: Tokenizer  # the model's (its Rust core: encoding is thread-safe), for the layout's tokens

    @classmethod
    def from_folder(cls, folder: Path) -> Idefics3ImageProcessor:
        from transformers import AutoTokenizer

        base, cfg = ImageProcessor.from_folder(folder), image_processor_config(folder)
        if base.do_resize and "longest_edge" not in base.size:
            raise ValueError(f"model: {folder}'s image processor resizes but names no size.longest_edge")
        return cls(base, base.size["longest_edge"] if base.do_resize else None,
                   cfg.get("max_image_size", {}).get("longest_edge", 364), cfg.get("do_image_splitting", True),
                   AutoTokenizer.from_pretrained(folder).backend_tokenizer)

    def tiles(self, image: Image.Image) -> tuple[list[Image.Image], int, int]:
        """(tiles, rows, cols): the split tiles then the global image, or one tile (rows = cols = 0)."""
        if self.longest_edge is not None:
            height, width = longest_edge_size(image.height, image.width, self.longest_edge)
            image = self.base.resize(image, width, height)
        if not self.split:
            return [self.base.resize(image, self.tile, self.tile)], 0, 0
        height, width = whole_tiles_size(image.height, image.width, self.tile)
        image = self.base.resize(image, width, height)
        if height <= self.tile and width <= self.tile:
            return [image], 0, 0
        rows, cols = height // self.tile, width // self.tile
        crops = [image.crop((c * self.tile, r * self.tile, (c + 1) * self.tile, (r + 1) * self.tile))
                 for r in range(rows) for c in range(cols)]
        return [*crops, self.base.resize(image, self.tile, self.tile)], rows, cols

    def pixels(self, tiles: list[Image.Image]) -> torch.Tensor:
        """[tiles, 3, tile, tile], rescaled and normalised."""
        return torch.stack([self.base.normalize(np.moveaxis(np.asarray(t), -1, 0)) for t in tiles])

    def placeholders(self, rows: int, cols: int, features: int) -> list[int]:
        """The prompt's token ids for one picture of rows x cols tiles (0 x 0: one tile)."""
        image = "<image>" * features
        text = "".join("".join(f"{AROUND}<row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n"
                       for r in range(rows))
        text += ("\n" if rows else "") + f"{AROUND}{GLOBAL}{image}{AROUND}"
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids
