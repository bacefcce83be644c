"""A real `codeyard serve` process and a real Chromium (Debian's, never a downloaded one)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from browser_kit import CHROMIUM, CHROMIUM_ARGS
from serve_process import codeyard_serve

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def server_url(tmp_path_factory) -> Iterator[str]:
    """`codeyard serve` on SQLite in a temporary data dir, as a user would start it."""
    with codeyard_serve(tmp_path_factory.mktemp("serve")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def screenshot():
    """Saves a screenshot of a page under test-artifacts/ (kept by CI as a record of key states)."""
    ARTIFACTS.mkdir(exist_ok=True)

    def take(page, name: str) -> None:
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    return take
