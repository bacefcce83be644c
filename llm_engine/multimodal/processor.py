"""Image preprocessing read from a model's preprocessor_config.json, equal to Transformers'
Pillow image processors (CLIP/SigLIP style): resize (shortest edge or fixed size), center crop,
rescale, normalise. Works on any input size: the output size depends only on the config.
LLaVA-NeXT's any-resolution tiling (`anyres_tiles`) adds tiles of the picture at the grid
resolution that fits it best, so large pictures keep their detail; LLaVA-OneVision gives each of
several pictures one tile instead, padded to a square (`pad_to_square`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _size(value: dict[str, int] | int | None) -> dict[str, int]:
    if isinstance(value, int):
        return {"height": value, "width": value}
    return dict(value or {})


def image_processor_config(folder: Path) -> dict[str, Any]:
    """The image processor's settings: preprocessor_config.json, or the `image_processor` part of
    processor_config.json (where Transformers 5 saves a whole processor's settings)."""
    single, whole = Path(folder) / "preprocessor_config.json", Path(folder) / "processor_config.json"
    if single.is_file():
        return dict(json.loads(single.read_text()))
    if whole.is_file() and "image_processor" in (cfg := json.loads(whole.read_text())):
        return dict(cfg["image_processor"])
    raise ValueError(f"model: {folder} has no preprocessor_config.json; it cannot read images")


@dataclass
class ImageProcessor:
    size: dict[str, int]
    crop_size: dict[str, int]
    resample: int = Image.Resampling.BICUBIC
    do_resize: bool = True
    do_center_crop: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD
    grid_pinpoints: list[list[int]] | None = None  # LLaVA-NeXT: (height, width) tilings

    @classmethod
    def from_folder(cls, folder: Path) -> ImageProcessor:
        cfg = image_processor_config(folder)
        return cls(size=_size(cfg.get("size")), crop_size=_size(cfg.get("crop_size")),
                   resample=cfg.get("resample", Image.Resampling.BICUBIC),
                   do_resize=cfg.get("do_resize", True), do_center_crop=cfg.get("do_center_crop", False),
                   do_rescale=cfg.get("do_rescale", True), rescale_factor=cfg.get("rescale_factor", 1 / 255),
                   do_normalize=cfg.get("do_normalize", True),
                   image_mean=tuple(cfg.get("image_mean", _CLIP_MEAN)),
                   image_std=tuple(cfg.get("image_std", _CLIP_STD)),
                   grid_pinpoints=cfg.get("image_grid_pinpoints"))

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize step, as Transformers computes it."""
        if "shortest_edge" in self.size:
            edge = self.size["shortest_edge"]
            if width <= height:
                return edge, int(edge * height / width)
            return int(edge * width / height), edge
        return self.size["width"], self.size["height"]

    def resize(self, image: Image.Image, width: int, height: int) -> Image.Image:
        return image.resize((width, height), resample=self.resample)

    def normalize(self, array: np.ndarray) -> torch.Tensor:
        """[3, H, W] uint8 -> float32, rescaled and normalised as configured."""
        if self.do_rescale:
            array = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            array = array.astype(np.float32)
        if self.do_normalize:
            mean = np.array(self.image_mean, dtype=np.float32)[:, None, None]
            std = np.array(self.image_std, dtype=np.float32)[:, None, None]
            array = (array - mean) / std
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """One upright RGB picture -> pixel values [3, H, W]."""
        if self.do_resize:
            image = self.resize(image, *self.resized_size(image.width, image.height))
        array = np.moveaxis(np.asarray(image), -1, 0)
        if self.do_center_crop:
            array = center_crop(array, self.crop_size["height"], self.crop_size["width"])
        return self.normalize(array)


def center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """Crop [C, H, W] around its centre; a too small side is first padded with zeros around it."""
    _, h, w = array.shape
    if h < height or w < width:
        padded = np.zeros((array.shape[0], max(h, height), max(w, width)), dtype=array.dtype)
        top, left = -(-(padded.shape[1] - h) // 2), -(-(padded.shape[2] - w) // 2)
        padded[:, top:top + h, left:left + w] = array
        array, h, w = padded, padded.shape[1], padded.shape[2]
    top, left = (h - height) // 2, (w - width) // 2
    return array[:, top:top + height, left:left + width]


def best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """The (height, width) tiling that keeps the most of the picture's pixels, then wastes least."""
    best, most_kept, least_wasted = None, 0, float("inf")
    for grid_h, grid_w in pinpoints:
        scale = min(grid_w / width, grid_h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = grid_w * grid_h - kept
        if kept > most_kept or (kept == most_kept and wasted < least_wasted):
            best, most_kept, least_wasted = (grid_h, grid_w), kept, wasted
    if best is None:
        raise ValueError("image processor: no grid resolutions (image_grid_pinpoints) to choose from")
    return best


def fit_inside(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """(height, width) of the picture scaled to fit the target, aspect ratio kept."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def anyres_tiles(processor: ImageProcessor, image: Image.Image) -> torch.Tensor:
    """LLaVA-NeXT: [the whole picture squeezed to one tile] + tiles of it resized into its best
    grid resolution and padded (centred, black) -> [tiles, 3, S, S]."""
    tile = processor.crop_size.get("height") or processor.size.get("height") or processor.size["shortest_edge"]
    side = processor.size.get("shortest_edge")
    base_h, base_w = (side, side) if side else (processor.size["height"], processor.size["width"])
    grid_h, grid_w = best_resolution(image.height, image.width, processor.grid_pinpoints or [])
    new_h, new_w = fit_inside(image.height, image.width, grid_h, grid_w)
    resized = np.asarray(processor.resize(image, new_w, new_h))
    top, left = (grid_h - new_h) // 2, (grid_w - new_w) // 2
    canvas = np.zeros((grid_h, grid_w, 3), dtype=np.uint8)
    canvas[top:top + new_h, left:left + new_w] = resized
    tiles = [processor.resize(image, base_w, base_h)]
    tiles += [Image.fromarray(canvas[y:y + tile, x:x + tile])
              for y in range(0, grid_h, tile) for x in range(0, grid_w, tile)]
    return torch.stack([processor(t) for t in tiles])


def pad_to_square(processor: ImageProcessor, image: Image.Image) -> Image.Image:
    """The picture centred on a square of the normalisation's mean colour (about 0 once normalised)."""
    side = max(image.size)
    if image.width == image.height:
        return image
    canvas = Image.new("RGB", (side, side), tuple(int(m * 255) for m in processor.image_mean))
    canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    return canvas
