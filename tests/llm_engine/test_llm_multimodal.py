"""LLaVA-1.5 and LLaVA-NeXT in the engine against Transformers: preprocessing, greedy parity with
images in every format (batched with text-only prompts, prefix caching on and off, prefill
chunks that split an image), the encoder-output cache, image-keyed prefix caching, bad input."""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch
from conftest import check_logprobs_close
from PIL import Image, ImageOps
from transformers import AutoConfig, AutoImageProcessor
from vision_models import (
    IMAGE_TOKEN,
    PROCESSORS,
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
from llm_engine.multimodal.processor import ImageProcessor, anyres_tiles, pad_to_square

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


@pytest.fixture(scope="module")
def processor_folders(tmp_path_factory):
    """A folder holding only each architecture's preprocessor_config.json."""
    folders = {}
    for kind, make in PROCESSORS.items():
        folders[kind] = tmp_path_factory.mktemp(f"processor-{kind}")
        make().save_pretrained(folders[kind])
    return folders


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_preprocessing_equals_transformers(processor_folders, kind, name):
    """CLIP's resize and crop (LLaVA-1.5), SigLIP's fixed size, and the any-resolution tiles of LLaVA-NeXT and
    OneVision: Transformers' pixel values to 1e-5 for every format, odd size and orientation."""
    processor = ImageProcessor.from_folder(processor_folders[kind])
    image = decode_image(FILES[name])
    ours = anyres_tiles(processor, image) if processor.grid_pinpoints else processor(image)
    reference = AutoImageProcessor.from_pretrained(processor_folders[kind])(upright(FILES[name]), return_tensors="pt")
    assert ours.shape == reference.pixel_values[0].shape
    assert torch.allclose(ours, reference.pixel_values[0], atol=1e-5, rtol=0)
    if processor.grid_pinpoints:
        assert reference.image_sizes[0].tolist() == list(upright(FILES[name]).size[::-1])


@pytest.mark.parametrize("name", sorted(FILES))
def test_onevision_several_pictures_preprocessing_equals_transformers(processor_folders, name):
    """A OneVision prompt with several pictures: each padded to a square of the mean colour, one tile."""
    processor = ImageProcessor.from_folder(processor_folders["llava_onevision"])
    ours = processor(pad_to_square(processor, decode_image(FILES[name])))
    pictures = [upright(FILES[name]), upright(FILES["png_tall"])]
    reference = AutoImageProcessor.from_pretrained(processor_folders["llava_onevision"])([pictures], return_tensors="pt")
    assert reference.batch_num_images.tolist() == [2]
    assert torch.allclose(ours, reference.pixel_values[0, 0], atol=1e-5, rtol=0)


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


def onevision_features(config, image, num_images):
    """Tiles, unpadded and shrunk, for a prompt's only picture; one tile and a newline for each of several."""
    if num_images > 1:
        return FEATURES + 1
    return LlavaOnevisionForConditionalGeneration.num_features(config, *image.size)


# The other architectures (`make test-llm-vision`): a builder, how many features a picture of (width, height)
# becomes in a prompt with n pictures, and prompts (zero, one or several pictures).
OTHER_ARCHITECTURES = {
    "llava_next": (partial(build_llava, next_version=True),
                   lambda config, image, n: LlavaNextForConditionalGeneration.num_features(config, *image.size),
                   PROMPTS[:5]),
    "siglip_qwen2": (build_llava_siglip, lambda config, image, n: FEATURES, [PROMPTS[0], PROMPTS[3], PROMPTS[4]]),
    "llava_onevision": (build_llava_onevision, onevision_features,
                        [PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[4], PROMPTS[6],
                         ([2, IMAGE_TOKEN, 9, 9], ["webp"]), ([IMAGE_TOKEN, 8, IMAGE_TOKEN, 9], ["png_tall", "webp"])]),
}


@pytest.fixture(scope="module", params=sorted(OTHER_ARCHITECTURES))
def other_architecture(request, tmp_path_factory):
    """(folder, prompts, Transformers' greedy references) for LLaVA-NeXT (any-resolution tiles: a picture's
    placeholder count depends on its size), LLaVA with SigLIP and Qwen2 (LLaVA-Interleave's shape: no class token,
    the last layer's states, fixed-size resizing), and LLaVA-OneVision (SigLIP, Qwen2, tiles, maps over
    `anyres_max_1` shrunk; several pictures in a prompt each one square tile)."""
    build, num_features, prompts = OTHER_ARCHITECTURES[request.param]
    folder = build(tmp_path_factory.mktemp(request.param))
    config = AutoConfig.from_pretrained(folder)
    references = [hf_reference(folder, ids, [upright(FILES[n]) for n in names],
                               [num_features(config, upright(FILES[n]), len(names)) for n in names], MAX_NEW)
                  for ids, names in prompts]
    return folder, prompts, references


@full_only
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_other_architectures_batched_parity_with_transformers(other_architecture, prefix_caching):
    folder, prompts, references = other_architecture
    check_batched_parity(folder, as_inputs(prompts), references, prefix_caching)


def check_batched_parity(folder, inputs, references, prefix_caching):
    """Greedy parity for the prompts in one batch (prefill chunks of 64 tokens), and again from the
    prefix cache when it is on. Returns the first outputs."""
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=256, max_num_batched_tokens=64,
              enable_prefix_caching=prefix_caching)
    outputs = llm.generate(inputs, GREEDY, use_tqdm=False)
    check_logprobs_close(results(outputs), references)
    if prefix_caching:  # everything again: from the prefix cache
        again = llm.generate(inputs, GREEDY, use_tqdm=False)
        assert sum(o.metrics.num_cached_tokens for o in again) > 0
        check_logprobs_close(results(again), references)
    return outputs


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
