"""Images in the OpenAI chat API (`image_url` parts with data: URLs), through the official
client, on a tiny random LLaVA with SmolLM2's tokenizer plus an `<image>` token."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
from vision_models import bomb_png, build_llava_chat, encode, picture

from .conftest import TINY_NAME, serve_model

VISION_NAME = "tiny-vision"


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory, smollm_tokenizer):
    folder = build_llava_chat(tmp_path_factory.mktemp(VISION_NAME), smollm_tokenizer)
    running = serve_model(folder, VISION_NAME, max_num_seqs=4, num_kv_blocks=64, max_model_len=512,
                          dtype="float32")
    yield running
    running.stop()


@pytest.fixture
def vision_client(vision_server):
    return openai.OpenAI(base_url=vision_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(client, url: str, question: str = "What is in this picture?", model: str = VISION_NAME, **kwargs):
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, **kwargs)


def test_chat_with_an_image_streams_and_counts_image_tokens(vision_client, vision_server):
    png = encode(picture(45, 31, 1, "RGBA"), "PNG")
    full = ask(vision_client, data_url(png))
    text_only = vision_client.chat.completions.create(
        model=VISION_NAME, messages=[{"role": "user", "content": "What is in this picture?"}], max_tokens=1)
    # the image is 25 placeholder positions plus the newline after them
    assert full.usage.prompt_tokens - text_only.usage.prompt_tokens == 25 + 1
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 6
    chunks = list(ask(vision_client, data_url(png), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content


def test_a_repeated_image_skips_the_encoder(vision_client, vision_server):
    jpeg = encode(picture(60, 40, 9), "JPEG")
    stats = vision_server.service.engine.engine.get_stats
    before = stats()
    first = ask(vision_client, data_url(jpeg, "image/jpeg"), "Describe it.")
    second = ask(vision_client, data_url(jpeg, "image/jpeg"), "Now describe it again, briefly.")
    after = stats()
    assert after.mm_cache_queries - before.mm_cache_queries == 2
    assert after.mm_cache_hits - before.mm_cache_hits == 1
    assert first.choices[0].message.content and second.choices[0].message.content
    metrics = httpx.get(vision_server.url + "/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:mm_cache_hits_total{")]
    assert hits and float(hits[0].split()[-1]) >= 1


BAD = {
    "remote_url": ("https://example.com/cat.png", "remote URLs are not fetched"),
    "file_url": ("file:///etc/passwd", "remote URLs are not fetched"),
    "not_a_data_url": ("cat.png", "expected a data:image"),
    "bad_base64": ("data:image/png;base64,@@@@", "not valid base64"),
    "corrupt": (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64), "not a readable"),
    "oversized": (data_url(b"\x89PNG\r\n\x1a\n" + bytes(21 * 1024 * 1024)), "over the limit of 20971520 bytes"),
    "decompression_bomb": (data_url(bomb_png(50_000, 50_000)), "decompression bomb"),
    "too_many_pixels": (data_url(bomb_png(8_000, 6_000)), "over the limit"),
}


@pytest.mark.parametrize("url,message", list(BAD.values()), ids=list(BAD))
def test_bad_images_are_a_clear_400(vision_client, url, message):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(vision_client, url)
    assert message in caught.value.body["message"]


def test_engine_serves_after_bad_input(vision_client):
    assert ask(vision_client, data_url(encode(picture(8, 8, 2), "WEBP"), "image/webp")).usage.completion_tokens == 6


def test_a_text_only_model_says_it_cannot_see(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, data_url(encode(picture(8, 8, 2), "PNG")), model=TINY_NAME)
    assert "cannot see images" in caught.value.body["message"]


def v2_infer(server, text: str, images: list[bytes]):
    """KServe v2 infer through Triton's own HTTP client: text_input plus an image_bytes_input row."""
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
    tensors = []
    for name, datatype, value in (("text_input", "BYTES", np.array([[text.encode()]], dtype=object)),
                                  ("image_bytes_input", "BYTES", np.array([images], dtype=object)),
                                  ("max_tokens", "INT32", np.array([[4]], dtype=np.int32)),
                                  ("ignore_eos", "BOOL", np.array([[True]]))):
        tensor = httpclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return client.infer(VISION_NAME, tensors)


def test_kserve_v2_image_tensor(vision_server):
    from tritonclient.utils import InferenceServerException

    stats = vision_server.service.engine.engine.get_stats
    before = stats().mm_cache_queries
    result = v2_infer(vision_server, "<image>\nWhat is in it?", [encode(picture(50, 20, 4), "PNG")])
    assert result.as_numpy("num_output_tokens")[0, 0] == 4
    assert stats().mm_cache_queries == before + 1
    with pytest.raises(InferenceServerException, match="not a readable") as corrupt:
        v2_infer(vision_server, "<image>\nAnd this?", [b"\x89PNG broken"])
    with pytest.raises(InferenceServerException, match=r"2 image placeholder\(s\) for 1 image") as miscounted:
        v2_infer(vision_server, "<image> <image> two?", [encode(picture(9, 9, 1), "PNG")])
    assert corrupt.value.status() == miscounted.value.status() == "400"
    assert v2_infer(vision_server, "<image>\nAnd now?", [encode(picture(9, 9, 1), "GIF")]).as_numpy(
        "num_output_tokens")[0, 0] == 4  # the engine serves on
