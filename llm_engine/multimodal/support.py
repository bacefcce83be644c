"""Whether a model takes images, read from its files alone (no torch, no loading): the IDE says
"cannot see images" before its model has loaded, or without ever loading it."""

from __future__ import annotations

import json
from pathlib import Path


def sees_images(model_path: str) -> bool:
    """A Hugging Face folder whose config.json nests a `vision_config` (LLaVA, SigLIP or CLIP towers:
    every vision-language config in Transformers has one); a .gguf file or a text model does not."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "vision_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False
