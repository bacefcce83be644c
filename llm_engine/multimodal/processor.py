"""Image preprocessing read from a model's preprocessor_config.json, equal to Transformers'
Pillow image processors (CLIP/SigLIP style): resize (shortest edge or fixed size), center crop,
rescale, normalise. Works on any input size: the output size depends only on the config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _size(value: dict | int | None) -> dict:
    if isinstance(value, int):
        return {"height": value, "width": value}
    return dict(value or {})


@dataclass
class ImageProcessor:
    size: dict
    crop_size: dict
    resample: int = Image.Resampling.BICUBIC
    do_resize: bool = True
    do_center_crop: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD

    @classmethod
    def from_folder(cls, folder: Path) -> ImageProcessor:
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            raise ValueError(f"model: {folder} has no preprocessor_config.json; it cannot read images")
        cfg = json.loads(path.read_text())
        return cls(size=_size(cfg.get("size")), crop_size=_size(cfg.get("crop_size")),
                   resample=cfg.get("resample", Image.Resampling.BICUBIC),
                   do_resize=cfg.get("do_resize", True), do_center_crop=cfg.get("do_center_crop", False),
                   do_rescale=cfg.get("do_rescale", True), rescale_factor=cfg.get("rescale_factor", 1 / 255),
                   do_normalize=cfg.get("do_normalize", True),
                   image_mean=tuple(cfg.get("image_mean", _CLIP_MEAN)),
                   image_std=tuple(cfg.get("image_std", _CLIP_STD)))

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
