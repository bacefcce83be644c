"""Images in chat messages: `image_url` parts with `data:` URLs only (the server fetches nothing),
placed in the prompt as the model's image placeholder.
"""

from __future__ import annotations

import base64
import binascii
import re

from llm_engine.entrypoints.protocol import ChatCompletionRequest, OpenAIError
from llm_engine.multimodal.limits import ImageLimits

_DATA_URL = re.compile(r"data:image/[a-z0-9.+-]+;base64,(?P<data>.*)", re.IGNORECASE | re.DOTALL)
MAX_IMAGES = 8


def decode_data_url(url: str, limits: ImageLimits = ImageLimits()) -> bytes:
    """The file bytes of a `data:image/...;base64,` URL; a 400 for anything else."""
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        if re.match(r"[a-z][a-z0-9+.-]*://", url.strip(), re.IGNORECASE):
            raise OpenAIError(400, "image_url: remote URLs are not fetched; send the image inline as a "
                                   "data:image/...;base64, URL", param="messages")
        raise OpenAIError(400, "image_url: expected a data:image/...;base64, URL", param="messages")
    encoded = match.group("data")
    if len(encoded) > limits.max_bytes * 4 // 3 + 4:
        raise OpenAIError(400, f"image_url: the image is over the limit of {limits.max_bytes} bytes",
                          param="messages")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise OpenAIError(400, "image_url: the data URL is not valid base64", param="messages") from None


def request_images(req: ChatCompletionRequest) -> list[bytes]:
    """The files of every image of the conversation, in order (decoded later, off the loop)."""
    urls = [url for message in req.messages for url in message.image_urls()]
    if len(urls) > MAX_IMAGES:
        raise OpenAIError(400, f"messages: at most {MAX_IMAGES} images per request", param="messages")
    return [decode_data_url(url) for url in urls]


def with_placeholders(req: ChatCompletionRequest, placeholder: str) -> list[dict[str, str]]:
    """Template messages where each image becomes the placeholder, before the message's text."""
    return [{"role": "system" if m.role == "developer" else m.role,
             "content": "".join(placeholder + "\n" for _ in m.image_urls()) + m.text()}
            for m in req.messages]
