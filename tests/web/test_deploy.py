"""The deployment panel in a real browser: Deploy makes a static site live at its URL, it scales
to two instances and back, a new release shows its build's progress and replaces it, a rollback
brings the old one back, a failing release never serves, Stop takes it offline; secrets are
saved masked and never shown again; viewers see neither secrets nor Deploy."""

import secrets
import time

import httpx
import pytest
from playwright.sync_api import expect

from browser_kit import api_client, join, signed_in_context

OWNER, VIEWER = "dpowner", "dpviewer"


@pytest.fixture(scope="module")
def owner_api(server_url) -> httpx.Client:
    return api_client(server_url, OWNER)


@pytest.fixture(scope="module")
def project_id(server_url, owner_api) -> str:
    """A static site owned by OWNER, with VIEWER as viewer."""
    project = owner_api.post("/api/projects", json={"name": "site", "template": "static"}).json()
    owner_api.put(f"/api/projects/{project['id']}/files/content/index.html", content=b"<h1>version one</h1>\n").raise_for_status()
    join(server_url, owner_api, project["id"], VIEWER, "viewer")
    return project["id"]


@pytest.fixture
def open_as(server_url, browser, project_id):
    """open_as(username) -> a page showing the project's workspace, signed in (confirm() dialogs accepted)."""
    contexts = []

    def open_page(username: str):
        context = signed_in_context(browser, server_url, username, height=900)
        contexts.append(context)
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"{server_url}/projects/{project_id}")
        expect(page.locator("#deploy-state")).to_be_visible()
        return page

    yield open_page
    for context in contexts:
        context.close()


def answer_of(url: str, expected: str, timeout: float = 30) -> str:
    """The page at url once it contains `expected` (the switch happens just after the status shows live)."""
    deadline = time.monotonic() + timeout
    while expected not in (text := httpx.get(url, timeout=10).text) and time.monotonic() < deadline:
        time.sleep(0.2)
    return text


def test_deploy_goes_live_redeploys_and_rolls_back(open_as, owner_api, project_id, screenshot):
    page = open_as(OWNER)
    expect(page.locator("#deploy-state")).to_have_text("○ Not deployed")
    page.locator("#deploy").click()
    expect(page.locator("#deploy-dialog")).to_be_visible()
    first = page.locator("#deploy-releases li").first
    expect(first).to_contain_text("#1")
    expect(page.locator("#deploy-status")).to_have_text("Live", timeout=90_000)
    expect(first).to_have_attribute("data-status", "live")
    expect(page.locator("#deploy-logs")).to_contain_text("release 1")  # streamed over the logs WebSocket
    expect(page.locator("#deploy-progress")).to_be_hidden()
    expect(page.locator("#deploy-message")).to_have_text("Release #1 is live.")
    url = page.locator("#deploy-url").get_attribute("href")
    assert "version one" in answer_of(url, "version one")
    screenshot(page, "deploy-live")
    page.locator("#deploy-instances").select_option("2")
    expect(page.locator("#deploy-status")).to_have_text("Live · 2/2 instances healthy", timeout=60_000)
    page.locator("#deploy-instances").select_option("1")
    expect(page.locator("#deploy-status")).to_have_text("Live", timeout=60_000)

    owner_api.put(f"/api/projects/{project_id}/files/content/index.html", content=b"<h1>version two</h1>\n").raise_for_status()
    slow_build = b'[deploy]\nbuild = ["python3", "-c", "import time; print(\'bundling assets\', flush=True); time.sleep(4)"]\n'
    owner_api.put(f"/api/projects/{project_id}/files/content/codeyard.toml", content=slow_build).raise_for_status()
    page.locator("#deploy-now").click()
    second = page.locator("#deploy-releases li").first
    expect(second).to_contain_text("#2")
    expect(page.locator("#deploy-logs")).to_contain_text("bundling assets")  # the build streams while it runs
    expect(page.locator("#deploy-progress")).to_be_visible()
    expect(second).to_have_attribute("data-status", "building")
    expect(second).to_have_attribute("data-status", "live", timeout=90_000)
    assert "version two" in answer_of(url, "version two")

    release_one = page.locator("#deploy-releases li").filter(has_text="#1")
    release_one.locator(".rollback").click()
    expect(release_one).to_contain_text("serving", timeout=90_000)
    expect(page.locator("#deploy-status")).to_have_text("Live")
    expect(page.locator("#deploy-message")).to_have_text("Release #1 is live.")
    assert "version one" in answer_of(url, "version one")
    screenshot(page, "deploy-rolled-back")

    broken = b'[deploy]\nrun = ["python3", "-c", "raise SystemExit(3)"]\n'
    owner_api.put(f"/api/projects/{project_id}/files/content/codeyard.toml", content=broken).raise_for_status()
    page.locator("#deploy-now").click()
    expect(page.locator("#deploy-message")).to_contain_text("Release #3 failed", timeout=90_000)
    expect(page.locator("#deploy-message")).to_contain_text("The previous release keeps serving.")
    expect(page.locator("#deploy-failure")).to_be_visible()  # the log tail as lines, apart from the message
    expect(page.locator('#deploy-releases li[data-status="failed"]')).to_contain_text("#3")
    expect(page.locator("#deploy-status")).to_have_text("Live")
    assert "version one" in httpx.get(url, timeout=10).text
    page.locator("#deploy-stop").click()
    expect(page.locator("#deploy-status")).to_have_text("Stopped")
    assert httpx.get(url, timeout=10).status_code == 503
    page.locator("#deploy-close").click()
    expect(page.locator("#deploy-state")).to_have_text("● Stopped")


def test_a_secret_is_saved_and_shown_only_masked(open_as, owner_api, project_id, screenshot):
    value = f"sv-{secrets.token_hex(10)}"
    page = open_as(OWNER)
    page.locator("#deploy-state").click()
    expect(page.locator("#deploy-dialog")).to_be_visible()
    expect(page.locator("#secret-list")).to_contain_text("No secrets yet.")
    page.locator("#secret-name").fill("API_KEY")
    page.locator("#secret-value").fill(value)
    expect(page.locator("#secret-value")).to_have_attribute("type", "password")
    page.locator("#secret-save").click()
    expect(page.locator("#secret-status")).to_have_text("Saved API_KEY. Redeploy for the app to see it.")
    row = page.locator('#secret-list li[data-name="API_KEY"]')
    expect(row.locator(".secret-mask")).to_have_text("••••••••")
    expect(page.locator("#secret-value")).to_have_value("")
    screenshot(page, "deploy-secrets-masked")
    page.reload()
    page.locator("#deploy-state").click()
    expect(row).to_contain_text(OWNER)
    assert value not in page.content()
    bad = page.locator("#secret-name")
    bad.fill("PATH")
    page.locator("#secret-value").fill("x")
    page.locator("#secret-save").click()
    expect(page.locator("#secret-status")).to_contain_text("PATH is reserved")
    page.locator("#secret-expose").check()
    expect(page.locator("#secret-status")).to_have_text("Runs get these variables now.")
    assert owner_api.get(f"/api/projects/{project_id}/secrets").json()["expose_to_runs"] is True
    row.get_by_role("button", name="Delete").click()
    expect(page.locator("#secret-list")).to_contain_text("No secrets yet.")


def test_viewers_see_no_deploy_button_and_no_secrets(open_as, owner_api, project_id):
    owner_api.put(f"/api/projects/{project_id}/secrets/VIEWER_HIDDEN", json={"value": "x"}).raise_for_status()
    page = open_as(VIEWER)
    expect(page.locator("#deploy")).to_be_hidden()
    page.locator("#deploy-state").click()
    expect(page.locator("#deploy-dialog")).to_be_visible()
    expect(page.locator("#deploy-now")).to_be_hidden()
    expect(page.locator("#deploy-logs-hidden")).to_contain_text("for the project's editors")
    assert page.locator("#deploy-secrets").count() == 0 and page.locator("#deploy-logs").count() == 0
    assert "VIEWER_HIDDEN" not in page.content()
