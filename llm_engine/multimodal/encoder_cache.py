"""The encoder-output cache: image features by the image's content hash, bounded in bytes, LRU.

A repeated image (the same screenshot asked about twice) skips the vision tower entirely.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from llm_engine.multimodal.inputs import ImageItem
    from llm_engine.sequence import Sequence


class EncoderCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()  # least recently used first
        self.queries = 0
        self.hits = 0

    def get_or_compute(self, key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.queries += 1
        found = self.entries.get(key)
        if found is not None:
            self.hits += 1
            self.entries.move_to_end(key)
            return found
        value = compute()
        size = value.numel() * value.element_size()
        if size <= self.max_bytes:
            while self.used_bytes + size > self.max_bytes:
                _, evicted = self.entries.popitem(last=False)
                self.used_bytes -= evicted.numel() * evicted.element_size()
            self.entries[key] = value
            self.used_bytes += size
        return value


class ImageEncoder(Protocol):
    """A vision model: pixel values of one image (and its upright size) -> its features."""

    def encode_image(self, pixel_values: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor: ...


def _encode(model: ImageEncoder, item: ImageItem, device: torch.device) -> torch.Tensor:
    return model.encode_image(item.pixel_values.to(device), item.image_size)


@torch.inference_mode()
def step_image_embeddings(model: ImageEncoder, cache: EncoderCache, scheduled: list[tuple[Sequence, int]],
                          device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, embeddings) for the image placeholders among this step's tokens, or None.

    `scheduled` is the step's (sequence, new tokens) list in row order. An image is encoded
    whole (or found in the cache) even when a prefill chunk covers only part of it.
    """
    rows: list[int] = []
    parts: list[torch.Tensor] = []
    row = 0
    for seq, num_new in scheduled:
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        for item in seq.request.images:
            lo, hi = max(start, item.offset), min(end, item.offset + item.num_tokens)
            if lo >= hi:
                continue
            features = cache.get_or_compute(item.hash, partial(_encode, model, item, device))
            if item.feature_mask is None:
                parts.append(features[lo - item.offset:hi - item.offset])
                rows.extend(range(row + lo - start, row + hi - start))
            else:  # features only for the masked positions, in order
                mask = item.feature_mask[lo - item.offset:hi - item.offset]
                first = int(item.feature_mask[:lo - item.offset].sum())
                parts.append(features[first:first + int(mask.sum())])
                rows.extend(row + lo - start + int(i) for i in mask.nonzero().flatten())
        row += num_new
    if not rows:
        return None
    return torch.tensor(rows, dtype=torch.long, device=device), torch.cat(parts)
