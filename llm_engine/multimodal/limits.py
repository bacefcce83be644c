"""How large an image a server accepts: its own module, free of Pillow and torch, so the servers
that only check requests (the IDE's /v1 glue) import it without the [llm] extra."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 36_000_000  # width * height of the decoded picture
    max_side: int = 16_384
