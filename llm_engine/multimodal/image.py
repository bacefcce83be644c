"""Decode untrusted image input into an RGB picture, with limits, and hash its content.

Only JPEG, PNG, WebP and GIF (first frame) are accepted. The pixel count is checked from the
header before any pixel is decoded, so a decompression bomb (a small file that expands to
gigapixels) is refused cheaply. EXIF orientation is applied, so a phone photo is upright.
Transparency is composited onto white, as Transformers' image processors do.
"""

from __future__ import annotations

import hashlib
import io
import warnings

from PIL import Image, ImageOps

from llm_engine.multimodal.limits import ImageLimits

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")


class ImageInputError(ValueError):
    """An image that cannot be used: corrupt, too large, wrong format (a 400 to a client)."""


def _to_rgb(image: Image.Image) -> Image.Image:
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _check_size(width: int, height: int, limits: ImageLimits) -> None:
    if width < 1 or height < 1:
        raise ImageInputError(f"image: empty picture ({width}x{height})")
    if width > limits.max_side or height > limits.max_side or width * height > limits.max_pixels:
        raise ImageInputError(f"image: {width}x{height} pixels is over the limit "
                              f"({limits.max_pixels} pixels, {limits.max_side} per side)")


def decode_image(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Bytes of a JPEG/PNG/WebP/GIF file -> an upright RGB picture; ImageInputError otherwise."""
    if not data:
        raise ImageInputError("image: empty file")
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"image: {len(data)} bytes is over the limit of {limits.max_bytes} bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            _check_size(image.width, image.height, limits)
            image.seek(0)  # GIF: the first frame
            image.load()
    except ImageInputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageInputError(f"image: refused as a decompression bomb ({exc})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageInputError(f"image: not a readable JPEG, PNG, WebP or GIF file ({exc})") from None
    return prepare_image(image, limits)


def prepare_image(image: object, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """A PIL picture -> upright RGB within the limits (pictures passed in directly get the same)."""
    if not isinstance(image, Image.Image):
        raise ImageInputError(f"image: expected a PIL image or file bytes, got {type(image).__name__}")
    _check_size(image.width, image.height, limits)
    try:
        upright = ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageInputError(f"image: unreadable EXIF data ({exc})") from None
    return _to_rgb(upright)


def image_hash(image: Image.Image) -> str:
    """Content hash of an RGB picture: the same pixels give the same key whatever the file format."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()
