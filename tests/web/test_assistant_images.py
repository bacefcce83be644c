"""Images in the assistant's chat, in a real browser: on a server whose model is a tiny random-weight LLaVA (built
here, with a tokenizer trained here), a pasted image goes with the question and the answer streams back, after the
model's vision tower saw it (and, asked again, its encoder-output cache); the panel's own checks and the server's
(400s, the engine serving on). On a server with the built-in text-only model, the panel says plainly that it cannot
see images, and the server refuses one with a 400 without ever loading the model."""

import base64
import re

import httpx
import pytest
from browser_kit import api_client, workspace_pages
from playwright.sync_api import expect
from serve_process import codeyard_serve
from vision_models import build_llava_chat, encode, picture, tiny_chat_tokenizer

OWNER = "painter"
PNG = encode(picture(45, 31, 1), "PNG")
JPEG = encode(picture(60, 40, 2), "JPEG")
MODEL_WAIT_MS = 120_000  # a tiny model, but torch's import and the shared CPU


@pytest.fixture(scope="module")
def vision_url(tmp_path_factory):
    """`codeyard serve` whose model (CODEYARD_LLM_MODEL) sees images, loading from start-up; short answers."""
    folder = build_llava_chat(tmp_path_factory.mktemp("tiny-vision"), tiny_chat_tokenizer())
    settings = {"CODEYARD_LLM_MODEL": str(folder), "CODEYARD_LLM_EAGER": "1", "CODEYARD_ASSISTANT_ANSWER_TOKENS": "12",
                "CODEYARD_ASSISTANT_BURST": "100"}
    with codeyard_serve(tmp_path_factory.mktemp("vision-serve"), settings) as url:
        yield url


def new_project(server_url: str, username: str) -> tuple[httpx.Client, str]:
    owner = api_client(server_url, username)
    project = owner.post("/api/projects", json={"name": "plots", "template": "python"}).json()
    owner.put(f"/api/projects/{project['id']}/files/content/main.py",
              content=b"import math\nprint([math.sin(x / 10) for x in range(60)])\n").raise_for_status()
    return owner, project["id"]


def give(page, data: bytes | int, name: str, mime: str, how: str = "paste") -> None:
    """Pastes (into the question) or drops (onto the panel) a file: `data` its bytes, or a size of zero bytes."""
    page.evaluate("""([data, name, mime, how]) => {
        const bytes = typeof data === 'number' ? new Uint8Array(data) : new Uint8Array(data);
        const files = new DataTransfer();
        files.items.add(new File([bytes], name, {type: mime}));
        const event = how === 'paste'
            ? new ClipboardEvent('paste', {clipboardData: files, bubbles: true, cancelable: true})
            : new DragEvent('drop', {dataTransfer: files, bubbles: true, cancelable: true});
        document.querySelector(how === 'paste' ? '#assistant-input' : '#assistant-panel').dispatchEvent(event);
    }""", [data if isinstance(data, int) else list(data), name, mime, how])


def counter(client: httpx.Client, name: str) -> float:
    lines = [line for line in client.get("/llm/metrics").text.splitlines() if line.startswith(f"vllm:{name}_total{{")]
    return float(lines[0].split()[-1]) if lines else 0.0


def chat_body(images: list[str], role: str = "user") -> dict:
    return {"path": "main.py", "content": "print(1)\n",
            "messages": [{"role": role, "content": "What is in this plot?", "images": images}]}


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_the_built_in_model_cannot_see_images(vision_url, server_url, browser):
    """First: the vision server (vision_url) loads its model meanwhile."""
    owner, project_id = new_project(server_url, "textonly")
    with workspace_pages(browser, server_url) as open_page:
        page = open_page("textonly", project_id)
        expect(page.locator("#assistant-status")).to_have_text("Assistant: the model loads on first use")
        page.locator("#assistant-button").click()
        expect(page.locator("#assistant-input")).to_have_attribute("placeholder", "Ask about the current file…")
        give(page, PNG, "plot.png", "image/png")
        expect(page.locator("#assistant-messages")).to_contain_text(
            "The assistant's model reads text only: it cannot see images.")
        expect(page.locator("#assistant-attachments img")).to_have_count(0)
    refused = owner.post(f"/api/projects/{project_id}/assistant/chat", json=chat_body([data_url(PNG)]))
    assert refused.status_code == 400
    assert "SmolLM2" in refused.json()["detail"] and "text-only: it cannot see images" in refused.json()["detail"]
    model = owner.get("/api/assistant/model").json()
    assert (model["state"], model["sees_images"]) == ("deferred", False)  # refused without loading the model


def test_a_pasted_image_is_answered_as_a_stream(vision_url, browser, screenshot):
    owner, project_id = new_project(vision_url, OWNER)
    with workspace_pages(browser, vision_url) as open_page:
        page = open_page(OWNER, project_id)
        expect(page.locator("#assistant-status")).to_have_text("Assistant ready", timeout=MODEL_WAIT_MS)
        assert owner.get("/api/assistant/model").json()["sees_images"] is True
        page.locator("#assistant-button").click()
        question = page.locator("#assistant-input")
        expect(question).to_have_attribute("placeholder", re.compile("paste or drop an image"))
        attached = page.locator("#assistant-attachments img")
        give(page, PNG, "plot.png", "image/png")
        give(page, JPEG, "dialog.jpg", "image/jpeg", how="drop")
        expect(attached).to_have_count(2)
        page.get_by_role("button", name="Remove image 2").click()
        expect(attached).to_have_count(1)
        # the panel's own checks: the size limit the server gives it, and the formats the model reads
        give(page, 6 * 1024 * 1024, "huge.png", "image/png")
        give(page, b"BM", "sketch.bmp", "image/bmp")
        panel = page.locator("#assistant-panel")
        expect(panel.locator(".status-info").filter(has_text="huge.png is 6.0 MB: images up to 5.0 MB")).to_be_visible()
        expect(panel.locator(".status-info").filter(has_text="sketch.bmp is image/bmp")).to_be_visible()
        expect(attached).to_have_count(1)
        screenshot(page, "assistant-image-attached")

        before = counter(owner, "mm_cache_queries")
        question.fill("What is in this plot?")
        with page.expect_response(re.compile(r"/assistant/chat$")) as sent:
            question.press("Enter")
        assert sent.value.request.post_data_json["messages"][0]["images"][0].startswith("data:image/png;base64,")
        assert sent.value.headers["content-type"].startswith("text/event-stream")
        pieces = [line for line in sent.value.text().splitlines() if '"content"' in line]
        assert len(pieces) >= 3, "the answer came as a stream of chunks"
        expect(panel.locator(".assistant-question-images img")).to_have_count(1)
        expect(page.locator("#assistant-attachments")).to_be_hidden()
        answer = panel.locator(".assistant-answer")
        expect(answer).not_to_have_class(re.compile("streaming"), timeout=60_000)
        expect(answer).not_to_have_class(re.compile("assistant-error"))
        assert answer.inner_text().strip()
        assert counter(owner, "mm_cache_queries") == before + 1  # the image reached the vision tower
        screenshot(page, "assistant-image-answered")

        # A follow-up shows the model the same image again: its features are not computed again (its blocks come
        # from the prefix cache, or a chunk that touches it from the encoder-output cache).
        encoded = counter(owner, "mm_cache_queries") - counter(owner, "mm_cache_hits")
        question.fill("And the axes?")
        question.press("Enter")
        expect(answer).to_have_count(2)
        expect(answer.last).not_to_have_class(re.compile("streaming"), timeout=60_000)
        expect(answer.last).not_to_have_class(re.compile("assistant-error"))
        assert counter(owner, "mm_cache_queries") - counter(owner, "mm_cache_hits") == encoded


BAD = {
    "oversized": ([data_url(b"\x89PNG" + bytes(6 * 1024 * 1024))], 400, "over the limit of 5242880 bytes"),
    "remote_url": (["https://example.com/plot.png"], 400, "remote URLs are not fetched"),
    "not_an_image": (["data:text/plain;base64,aGk="], 400, "expected a data:image"),
    "corrupt": ([data_url(b"\x89PNG\r\n\x1a\n" + bytes(64))], 400, "not a readable"),
    "too_many": ([data_url(PNG)] * 5, 422, "at most 4"),
}


def test_bad_images_are_clear_errors_and_the_model_answers_on(vision_url):
    owner, project_id = new_project(vision_url, "checker")
    url = f"/api/projects/{project_id}/assistant/chat"
    for name, (images, status, message) in BAD.items():
        refused = owner.post(url, json=chat_body(images))
        assert refused.status_code == status and message in refused.text, (name, refused.status_code, refused.text)
    shown_by_the_model = owner.post(url, json=chat_body([data_url(PNG)], role="assistant"))
    assert shown_by_the_model.status_code == 422 and "only the user's messages carry images" in shown_by_the_model.text
    answer = owner.post(url, json=chat_body([data_url(JPEG, "image/jpeg")]))
    assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    assert answer.text.count('"content"') >= 3
