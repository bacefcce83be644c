"""LLaVA-1.5 and LLaVA-NeXT in the engine against Transformers: preprocessing, greedy parity with
images in every format (batched with text-only prompts, prefix caching on and off, prefill
chunks that split an image), the encoder-output cache, image-keyed prefix caching, bad input."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import check_logprobs_close
from PIL import Image, ImageOps
from transformers import AutoConfig, AutoImageProcessor
from vision_models import (
    IMAGE_TOKEN,
    bomb_png,
    build_llava,
    build_llava_onevision,
    build_llava_siglip,
    encode,
    hf_reference,
    picture,
)

from llm_engine import LLM, SamplingParams
from llm_engine.models.llava_next import LlavaNextForConditionalGeneration
from llm_engine.models.llava_onevision import LlavaOnevisionForConditionalGeneration
from llm_engine.multimodal.image import ImageInputError, ImageLimits, decode_image
from llm_engine.multimodal.inputs import ImageItem, fit_encoder_budget
from llm_engine.multimodal.processor import ImageProcessor, anyres_tiles

# The default suite runs LLaVA-1.5 end to end; `make test-llm-vision` adds NeXT, OneVision, SigLIP/Qwen2.
full_only = pytest.mark.skipif(not os.environ.get("CODEYARD_VISION_FULL"), reason="make test-llm-vision")
MAX_NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
FEATURES = 25  # (30 px / 6 px patches)^2


def exif_rotated_jpeg(width: int, height: int, seed: int) -> bytes:
    """A JPEG stored sideways with EXIF orientation 6 (rotate 90° clockwise to view)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(picture(width, height, seed), "JPEG", exif=exif, quality=90)


def two_frame_gif(width: int, height: int) -> bytes:
    first, second = picture(width, height, 5).convert("P"), picture(width, height, 6).convert("P")
    return encode(first, "GIF", save_all=True, append_images=[second])


FILES = {  # name -> file bytes: every format, odd sizes, an orientation, transparency
    "png_rgba": encode(picture(41, 25, 1, "RGBA"), "PNG"),
    "jpeg_exif": exif_rotated_jpeg(33, 17, 2),
    "webp": encode(picture(64, 47, 3), "WEBP", lossless=True),
    "gif": two_frame_gif(20, 9),
    "png_gray_tiny": encode(picture(7, 5, 4, "L"), "PNG"),
    "png_tall": encode(picture(13, 90, 7), "PNG"),
}


def upright(data: bytes) -> Image.Image:
    """What the reference sees: Pillow's own decoding with the EXIF orientation applied."""
    import io
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.mark.parametrize("name", sorted(FILES))
def test_preprocessing_equals_transformers(llava, name):
    ours = ImageProcessor.from_folder(llava)(decode_image(FILES[name]))
    reference = AutoImageProcessor.from_pretrained(llava)(upright(FILES[name]), return_tensors="pt").pixel_values[0]
    assert ours.shape == reference.shape
    assert torch.allclose(ours, reference, atol=1e-5, rtol=0)


def test_exif_orientation_and_gif_first_frame():
    assert decode_image(FILES["jpeg_exif"]).size == (17, 33)  # stored 33x17, shown upright
    first = decode_image(FILES["gif"])
    assert first.tobytes() == picture(20, 9, 5).convert("P").convert("RGB").tobytes()


# (token ids with one IMAGE_TOKEN per image, images by name)
PROMPTS = [
    ([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], []),
    ([3, 4, IMAGE_TOKEN, 40, 41, 42], ["jpeg_exif"]),
    ([3, 4, IMAGE_TOKEN, 40, 41, 42], ["png_rgba"]),  # same text, another image
    ([7, IMAGE_TOKEN, 50, 51, IMAGE_TOKEN, 52] + list(range(60, 80)), ["webp", "gif"]),
    ([IMAGE_TOKEN] + list(range(100, 140)), ["png_tall"]),
    ([9, 8, 7, 6, 5], []),
    ([11, 12, 13, IMAGE_TOKEN, 14, IMAGE_TOKEN, 15, IMAGE_TOKEN], ["png_gray_tiny", "jpeg_exif", "gif"]),
]


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp("tiny-llava-next"), next_version=True)


@pytest.mark.parametrize("name", sorted(FILES))
def test_anyres_tiles_equal_transformers(llava_next, name):
    ours = anyres_tiles(ImageProcessor.from_folder(llava_next), decode_image(FILES[name]))
    reference = AutoImageProcessor.from_pretrained(llava_next)(upright(FILES[name]), return_tensors="pt")
    assert reference.image_sizes[0].tolist() == list(upright(FILES[name]).size[::-1])
    assert torch.allclose(ours, reference.pixel_values[0], atol=1e-5, rtol=0)


@full_only
def test_llava_next_batched_parity_with_transformers(llava_next):
    """Any-resolution tiling: each picture's placeholder count depends on its size."""
    config = AutoConfig.from_pretrained(llava_next)
    prompts = PROMPTS[:5]
    references = [hf_reference(llava_next, ids, [upright(FILES[n]) for n in names],
                               [LlavaNextForConditionalGeneration.num_features(config, *upright(FILES[n]).size)
                                for n in names], MAX_NEW) for ids, names in prompts]
    llm = LLM(str(llava_next), dtype="float32", num_kv_blocks=256, max_num_batched_tokens=64)
    outputs = llm.generate(as_inputs(prompts), GREEDY, use_tqdm=False)
    check_logprobs_close(results(outputs), references)


@full_only
def test_siglip_qwen2_llava_parity_with_transformers(tmp_path):
    """The SigLIP tower (no class token, bias on the patch convolution, last layer's states) and a
    Qwen2 decoder, as LLaVA-Interleave pairs them; fixed-size resizing without a crop."""
    folder = build_llava_siglip(tmp_path)
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[4]]
    references = [hf_reference(folder, ids, [upright(FILES[n]) for n in names], [FEATURES] * len(names), MAX_NEW)
                  for ids, names in prompts]
    ours = ImageProcessor.from_folder(folder)(decode_image(FILES["png_tall"]))
    reference = AutoImageProcessor.from_pretrained(folder)(upright(FILES["png_tall"]), return_tensors="pt")
    assert torch.allclose(ours, reference.pixel_values[0], atol=1e-5, rtol=0)
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=256)
    check_logprobs_close(results(llm.generate(as_inputs(prompts), GREEDY, use_tqdm=False)), references)


@full_only
def test_llava_onevision_parity_with_transformers(tmp_path):
    """SigLIP + Qwen2 + tiles, feature maps over `anyres_max_1` shrunk; one picture per prompt."""
    folder = build_llava_onevision(tmp_path)
    config = AutoConfig.from_pretrained(folder)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[4], ([2, IMAGE_TOKEN, 9, 9], ["webp"])]
    references = [hf_reference(folder, ids, [upright(FILES[n]) for n in names],
                               [LlavaOnevisionForConditionalGeneration.num_features(config, *upright(FILES[n]).size)
                                for n in names], MAX_NEW) for ids, names in prompts]
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=256)
    check_logprobs_close(results(llm.generate(as_inputs(prompts), GREEDY, use_tqdm=False)), references)
    with pytest.raises(ImageInputError, match="at most 1 image"):
        llm.generate(as_inputs(PROMPTS[3:4]), GREEDY, use_tqdm=False)


@pytest.fixture(scope="module")
def references(llava):
    return [hf_reference(llava, ids, [upright(FILES[n]) for n in names], [FEATURES] * len(names), MAX_NEW)
            for ids, names in PROMPTS]


def as_inputs(prompts):
    return [{"prompt_token_ids": ids, "multi_modal_data": {"image": [FILES[n] for n in names]}}
            for ids, names in prompts]


def results(outputs):
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


@pytest.mark.parametrize("engine_kwargs", [
    pytest.param(dict(enable_prefix_caching=False), id="no-prefix-cache", marks=full_only),
    pytest.param(dict(enable_prefix_caching=True), id="prefix-cache"),
    pytest.param(dict(max_num_batched_tokens=16, attention_backend="torch", enable_prefix_caching=False),
                 id="chunked-prefill-no-prefix-cache")])
def test_batched_parity_with_transformers(llava, references, engine_kwargs):
    llm = LLM(str(llava), dtype="float32", num_kv_blocks=256, **engine_kwargs)
    outputs = llm.generate(as_inputs(PROMPTS), GREEDY, use_tqdm=False)
    assert [len(o.prompt_token_ids) for o in outputs][1] == 5 + FEATURES
    check_logprobs_close(results(outputs), references)
    if engine_kwargs.get("enable_prefix_caching"):  # everything again: from the prefix cache
        again = llm.generate(as_inputs(PROMPTS), GREEDY, use_tqdm=False)
        assert sum(o.metrics.num_cached_tokens for o in again) >= 6 * 16
        check_logprobs_close(results(again), references)


def test_encoder_cache_and_image_keyed_prefix_cache(llava, references):
    llm = LLM(str(llava), dtype="float32", num_kv_blocks=256, block_size=4)
    first = llm.generate(as_inputs(PROMPTS[1:2]), GREEDY, use_tqdm=False)[0]
    stats = llm.engine.get_stats()
    assert (stats.mm_cache_queries, stats.mm_cache_hits) == (1, 0)
    # Same image after other text: the prefix cache cannot help, the encoder cache does.
    moved = ([90, 91, 92, 93, 94, IMAGE_TOKEN, 40], ["jpeg_exif"])
    llm.generate(as_inputs([moved]), GREEDY, use_tqdm=False)
    stats = llm.engine.get_stats()
    assert (stats.mm_cache_queries, stats.mm_cache_hits) == (2, 1)
    # Same text, another image: only the block before the image may come from the prefix cache.
    other = llm.generate(as_inputs(PROMPTS[2:3]), GREEDY, use_tqdm=False)[0]
    assert other.metrics.num_cached_tokens == 0  # [3, 4, img, img] is the first block already
    check_logprobs_close(results([first, other]), references[1:3])
    # The same image and text again: the image's blocks are found by its hash.
    again = llm.generate(as_inputs(PROMPTS[1:2]), GREEDY, use_tqdm=False)[0]
    assert again.metrics.num_cached_tokens == 28
    check_logprobs_close(results([again]), references[1:2])


def test_encoder_budget_cuts_prefill_chunks_before_images():
    items = [ImageItem("a", torch.zeros(1), (1, 1), 2, 25), ImageItem("b", torch.zeros(1), (1, 1), 30, 25)]
    assert fit_encoder_budget(items, 0, 64, 64, 64) == (64, 50)
    assert fit_encoder_budget(items, 0, 64, 40, 64) == (30, 25)  # b does not fit what is left
    assert fit_encoder_budget(items, 0, 64, 20, 64) == (2, 0)  # neither: the text before a runs
    assert fit_encoder_budget(items, 0, 64, 16, 16) == (30, 25)  # the step's first image always runs
    assert fit_encoder_budget(items, 27, 10, 0, 64) == (3, 0)  # a began earlier; b waits


BAD_FILES = {
    "garbage_png": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "not a readable"),
    "truncated_png": (FILES["png_tall"][:60], "not a readable"),
    "broken_gif": (b"GIF89a" + b"\x01" * 5, "not a readable"),
    "bmp": (encode(picture(8, 8, 1), "BMP"), "not a readable"),
    "bomb": (bomb_png(50_000, 50_000), "decompression bomb"),
    "48_megapixels": (bomb_png(8_000, 6_000), "pixels is over the limit"),
    "empty": (b"", "empty file"),
}


@pytest.mark.parametrize("data,message", list(BAD_FILES.values()), ids=list(BAD_FILES))
def test_bad_files_are_refused(data, message):
    with pytest.raises(ImageInputError, match=message):
        decode_image(data)


def test_size_limits():
    with pytest.raises(ImageInputError, match="bytes is over the limit"):
        decode_image(FILES["webp"], ImageLimits(max_bytes=100))
    with pytest.raises(ImageInputError, match="pixels is over the limit"):
        decode_image(FILES["png_tall"], ImageLimits(max_pixels=1000))


def test_bad_requests_leave_the_engine_serving(llava, references, tiny_llama):
    llm = LLM(str(llava), dtype="float32", num_kv_blocks=256)
    bad = [
        ({"prompt_token_ids": [3, IMAGE_TOKEN], "multi_modal_data": {"image": []}}, "0 image"),
        ({"prompt_token_ids": [3, 4], "multi_modal_data": {"image": [FILES["gif"]]}}, "0 image placeholder"),
        ({"prompt_token_ids": [3, IMAGE_TOKEN], "multi_modal_data": {"image": [b"nope"]}}, "not a readable"),
        ({"prompt_token_ids": [3, IMAGE_TOKEN], "multi_modal_data": {"image": ["a.png"]}}, "expected a PIL"),
        ({"prompt_token_ids": [3], "multi_modal_data": {"video": []}}, "only {'image'"),
        ({"prompt": "x", "prompt_token_ids": [3]}, "exactly one"),
    ]
    for prompt, message in bad:
        with pytest.raises(ValueError, match=message):
            llm.generate(prompt, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    check_logprobs_close(results(llm.generate(as_inputs(PROMPTS[1:2]), GREEDY, use_tqdm=False)), references[1:2])
    with pytest.raises(ValueError, match="vision models run on one rank"):
        LLM(str(llava), tensor_parallel_size=2)
    text_only = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16)
    with pytest.raises(ImageInputError, match="text-only model; it cannot see images"):
        text_only.generate({"prompt_token_ids": [3, 4], "multi_modal_data": {"image": [FILES["gif"]]}},
                           GREEDY, use_tqdm=False)
