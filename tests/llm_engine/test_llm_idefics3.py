"""Idefics3 (SmolVLM's shape) in the engine against Transformers: image splitting and pixel values,
the prompt layout of tile markers and `<image>` tokens, and greedy parity for prompts with zero, one
and several pictures batched together, prefix caching on and off (`make test-llm-vision`)."""

from __future__ import annotations

import pytest
import torch
from test_llm_multimodal import FILES, MAX_NEW, check_batched_parity, full_only, upright
from vision_models import build_idefics3, idefics3_processor, idefics3_reference

from llm_engine.multimodal.idefics3 import Idefics3ImageProcessor
from llm_engine.multimodal.image import decode_image


@pytest.fixture(scope="module", params=[True, False], ids=["split", "no-split"])
def processors(request, tmp_path_factory):
    """(Transformers' Idefics3 processor, ours) from a folder holding only the processor and tokenizer."""
    folder = tmp_path_factory.mktemp("idefics3-processor")
    return idefics3_processor(folder, split=request.param), Idefics3ImageProcessor.from_folder(folder)


@pytest.mark.parametrize("name", sorted(FILES))
def test_splitting_and_layout_equal_transformers(processors, name):
    """Pixel values to 1e-5 for every format, odd size and orientation, and the prompt's token ids
    (tile markers, row newlines, the global image) equal to what Transformers' processor writes."""
    reference, ours = processors
    tiles, rows, cols = ours.tiles(decode_image(FILES[name]))
    expected = reference(text=["Q:<image>A"], images=[[upright(FILES[name])]], return_tensors="pt")
    pixels = ours.pixels(tiles)
    assert pixels.shape == expected.pixel_values[0].shape
    assert torch.allclose(pixels, expected.pixel_values[0], atol=1e-5, rtol=0)
    tokenizer = reference.tokenizer
    before, after = (tokenizer(part, add_special_tokens=False).input_ids for part in ("Q:", "A"))
    assert before + ours.placeholders(rows, cols, 9) + after == expected.input_ids[0].tolist()


PROMPTS = [  # text with one <image> per picture, pictures by name
    ("What is in this plot? The axes show the sine of x.", []),
    ("Question:\n\n<image>What is in this plot?", ["webp"]),
    ("<image>def area(radius):", ["png_tall"]),
    ("Question:\n\n<image>What is in this plot?", ["jpeg_exif"]),  # same text, another picture
    ("<image> and <image>: the axes", ["gif", "png_rgba"]),
    ("Compare <image>, <image> and <image>.\n\nAnswer:", ["png_gray_tiny", "webp", "jpeg_exif"]),
]


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    """(folder, prompt token ids as the tokenizer writes them, Transformers' references)."""
    folder = build_idefics3(tmp_path_factory.mktemp("idefics3"))
    references = [idefics3_reference(folder, text, [upright(FILES[n]) for n in names], MAX_NEW)
                  for text, names in PROMPTS]
    tokenizer = idefics3_processor(tmp_path_factory.mktemp("idefics3-tokenizer")).tokenizer
    token_ids = [tokenizer(text, add_special_tokens=False).input_ids for text, _ in PROMPTS]
    return folder, token_ids, references


@full_only
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_batched_parity_with_transformers(idefics3, prefix_caching):
    folder, token_ids, references = idefics3
    inputs = [{"prompt_token_ids": ids, "multi_modal_data": {"image": [FILES[n] for n in names]}}
              for ids, (_, names) in zip(token_ids, PROMPTS)]
    expected = [(tokens, logprobs) for _, tokens, logprobs in references]
    outputs = check_batched_parity(folder, inputs, expected, prefix_caching)
    assert [o.prompt_token_ids for o in outputs] == [prompt for prompt, _, _ in references]
