"""Debian's Chromium flags and signed-in helpers (shared by the browser tests and benchmarks/web_bench.py);
`codeyard serve` as a subprocess comes from tests/serve_process.py."""

import time
from contextlib import contextmanager

import httpx
from playwright.sync_api import expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


PASSWORD = "correct horse battery"


def join(server_url: str, owner: httpx.Client, project_id: str, username: str, role: str) -> None:
    """username (registered) joins the owner's project with role, by an invite link as in the UI."""
    invite = owner.post(f"/api/projects/{project_id}/invites", json={"role": role}).json()
    api_client(server_url, username).post(f"/api/invites/{invite['token']}/accept").raise_for_status()


def api_client(server_url: str, username: str, register: bool = True) -> httpx.Client:
    """An HTTP client signed in as username (registered first unless register=False), with its CSRF header set."""
    client = httpx.Client(base_url=server_url, timeout=30)
    if register:
        client.post("/api/auth/register", json={"username": username, "password": PASSWORD}).raise_for_status()
    client.post("/api/auth/login", json={"username": username, "password": PASSWORD}).raise_for_status()
    client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
    return client


def editor_text(page) -> str:
    """The open file's text as the document holds it: no cursor labels of other people, no ghost text."""
    return page.evaluate("""() => {
        const host = [...document.querySelectorAll('.editor-host')].find((el) => !el.hidden);
        return [...host.querySelectorAll('.cm-line')].map((line) => {
            const copy = line.cloneNode(true);
            copy.querySelectorAll('.cm-ySelectionCaret, .cm-ghost-text').forEach((el) => el.remove());
            return copy.textContent.replaceAll('\\u2060', '');
        }).join('\\n');
    }""")


def signed_in_context(browser, server_url: str, username: str, *, register: bool = False,
                      width: int = 1280, height: int = 720):
    """A browser context (its own cookies) signed in as username, registered first if register=True."""
    context = browser.new_context(viewport={"width": width, "height": height})
    credentials = {"username": username, "password": PASSWORD}
    if register:
        context.request.post(server_url + "/api/auth/register", data=credentials)
    context.request.post(server_url + "/api/auth/login", data=credentials)
    return context


@contextmanager
def workspace_pages(browser, server_url: str):
    """Yields open(username, project_id, width=1280, height=720, theme=None) -> a page showing the
    project's workspace (synced), each in a signed-in context of its own; all close afterwards."""
    contexts = []

    def open_page(username: str, project_id: str, width: int = 1280, height: int = 720, theme: str | None = None):
        context = signed_in_context(browser, server_url, username, width=width, height=height)
        contexts.append(context)
        if theme is not None:
            context.add_init_script(f"localStorage.setItem('codeyard-theme', '{theme}')")
        page = context.new_page()
        page.goto(f"{server_url}/projects/{project_id}")
        expect(page.locator("#connection")).to_have_text("Synced")
        return page

    try:
        yield open_page
    finally:
        for context in contexts:
            context.close()


def open_shell(page):
    """The workspace's Shell pane: opened, at its prompt, focused for typing."""
    page.locator("#shell-tab").click()
    shell = page.locator("#shell")
    expect(shell.locator(".xterm-rows")).to_contain_text("$", timeout=20_000)
    shell.locator(".xterm-helper-textarea").focus()
    return shell


LOOKS = {"laptop": (1366, 768), "phone": (390, 844)}


def each_look(page, screenshot, name: str) -> None:
    """Screenshots of a page as it is, light and dark, on a laptop and a phone (`name-dark-phone`...); it ends light,
    at 1366x768. The workspace switches with its theme button; other pages follow the system's scheme, emulated."""
    toggle = page.locator("#theme").count() > 0
    for size, (width, height) in LOOKS.items():
        page.set_viewport_size({"width": width, "height": height})
        for theme in ("light", "dark"):
            if not toggle:
                page.emulate_media(color_scheme=theme)
            elif page.evaluate("document.documentElement.dataset.theme") != theme:
                page.locator("#theme").click()
            screenshot(page, f"{name}-{theme}-{size}")
    if toggle:
        page.locator("#theme").click()
    else:
        page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1366, "height": 768})


def wait_for_file(context, server_url: str, project_id: str, path: str, text: str, timeout: float = 15) -> None:
    """The project's file on the server (where the collaborative document is saved) becomes `text`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        answer = context.request.get(f"{server_url}/api/projects/{project_id}/files/content/{path}")
        last = answer.text() if answer.ok else f"HTTP {answer.status}"
        if last == text:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} is {last!r}, never {text!r}")
