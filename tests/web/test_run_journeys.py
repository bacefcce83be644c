"""Runs as learners and pair programmers live them, in real browsers: a pause at input(), Stop, a partner's
shared console and live tree, and packages installed for each new import (from PyPI, through the sandbox's proxy)."""

import os
import re
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from browser_kit import api_client, each_look, join, open_shell, workspace_pages
from serve_process import codeyard_serve

OWNER, PARTNER = "rjowner", "rjpartner"
# How long the learner thinks at input(): past the strict wall limit of 10 s; make test-long: the 30 s.
PAUSE_SECONDS = 30 if os.environ.get("CODEYARD_LONG") else 12
INSTALL_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """`codeyard serve` with a packages folder the sandbox uids can reach (pytest's tmp folders are 0700)."""
    packages = Path(tempfile.mkdtemp(prefix="codeyard-web-packages-"))
    os.chmod(packages, 0o711)
    try:
        with codeyard_serve(tmp_path_factory.mktemp("serve"), {"CODEYARD_PACKAGES_DIR": str(packages)}) as url:
            yield url
    finally:
        shutil.rmtree(packages, ignore_errors=True)


@pytest.fixture(scope="module")
def owner(server_url):
    return api_client(server_url, OWNER)


@pytest.fixture(scope="module")
def project_id(server_url, owner) -> str:
    project = owner.post("/api/projects", json={"name": "journeys", "template": "python"}).json()
    join(server_url, owner, project["id"], PARTNER, "editor")
    return project["id"]


@pytest.fixture
def open_as(server_url, browser):
    """open_as(username, project_id) -> the project's workspace in a browser context of its own, light, 1366x768."""
    with workspace_pages(browser, server_url) as open_page:
        yield lambda username, project_id: open_page(username, project_id, 1366, 768, theme="light")


def write(owner, project_id: str, path: str, text: str) -> None:
    owner.put(f"/api/projects/{project_id}/files/content/{path}", content=text.encode()).raise_for_status()


def run_from_editor(page, expected_text: str) -> None:
    """Ctrl+Enter in main.py's editor once it shows the program."""
    page.locator('#file-tree li[data-path="main.py"] .file').click()
    expect(page.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text(expected_text)
    page.locator(".editor-host:not([hidden]) .cm-content").click()
    page.keyboard.press("Control+Enter")


def test_a_pause_at_input_keeps_the_run(owner, project_id, open_as, screenshot):
    write(owner, project_id, "main.py", 'name = input("Your name? ")\nprint("Hello, " + name + "!")\n')
    ada = open_as(OWNER, project_id)
    run_from_editor(ada, "Your name?")
    console = ada.locator("#console")
    expect(console).to_contain_text("Your name?", timeout=20_000)
    expect(console).to_contain_text("The clock stops while the program waits for input")
    expect(ada.locator("#run-summary")).to_have_text("Waiting for input…")
    ada.wait_for_timeout(PAUSE_SECONDS * 1000)  # thinking, for longer than a strict run may last
    expect(ada.locator("#run-summary")).to_have_text("Waiting for input…")
    console.locator(".xterm-helper-textarea").focus()
    ada.keyboard.type("Grace\n")
    expect(console).to_contain_text("Hello, Grace!", timeout=20_000)
    expect(ada.locator("#run-summary")).to_contain_text("Finished")
    each_look(ada, screenshot, "runs-input-pause")
    # Ctrl+D ends the input of a program that reads until end of file.
    write(owner, project_id, "main.py", "import sys\nprint(len(sys.stdin.read().split()), 'words')\n")
    run_from_editor(ada, "sys.stdin.read()")
    expect(ada.locator("#run-summary")).to_have_text("Waiting for input…", timeout=20_000)
    console.locator(".xterm-helper-textarea").focus()
    ada.keyboard.type("one two\nthree")
    ada.keyboard.press("Control+d")
    expect(console).to_contain_text("3 words", timeout=20_000)


def test_stop_a_running_loop(owner, project_id, open_as, screenshot):
    write(owner, project_id, "main.py", "import itertools, time\nfor i in itertools.count():\n    print('tick', i)\n    time.sleep(0.2)\n")
    ada = open_as(OWNER, project_id)
    run_button = ada.locator("#run")
    expect(run_button).to_have_attribute("title", "Run (Ctrl+Enter)")
    run_from_editor(ada, "itertools.count()")
    expect(ada.locator("#console")).to_contain_text("tick 3", timeout=20_000)
    expect(run_button).to_have_text("Stop")
    expect(run_button.locator("svg.icon-stop")).to_have_count(1)
    expect(run_button).to_have_attribute("title", "Stop the program (Ctrl+C in the console)")
    each_look(ada, screenshot, "runs-stop-button")
    run_button.click()
    expect(ada.locator("#run-summary")).to_contain_text("Stopped")
    expect(run_button).to_have_text("Run")


def test_partner_sees_the_run_and_its_files(owner, project_id, open_as, screenshot):
    write(owner, project_id, "helper.py", "GREETING = 'from the run'\n")
    write(owner, project_id, "main.py", "import helper\nprint(helper.GREETING)\nopen('made_by_run.txt', 'w').write('hi')\n"
                                        "print('partner says', input('? '))\n")
    ada, bob = open_as(OWNER, project_id), open_as(PARTNER, project_id)
    run_from_editor(ada, "made_by_run.txt")
    bob_console = bob.locator("#console")
    expect(bob_console).to_contain_text(f"{OWNER} is running", timeout=20_000)
    expect(bob_console).to_contain_text("from the run", timeout=20_000)
    expect(bob.locator("#run-summary")).to_contain_text(OWNER)
    bob.reload()  # a workspace opened mid-run follows the live run, its output so far replayed
    expect(bob_console).to_contain_text(f"{OWNER} is running", timeout=20_000)
    expect(bob_console).to_contain_text("from the run", timeout=20_000)
    bob_console.locator(".xterm-helper-textarea").focus()  # an editor may answer the program's input
    bob.keyboard.type("hello\n")
    for page in (ada, bob):
        expect(page.locator("#console")).to_contain_text("partner says hello", timeout=20_000)
        expect(page.locator('#file-tree li[data-path="made_by_run.txt"]')).to_be_visible()
    # The bytecode cache the import left is generated: hidden unless asked for, and then shown whole.
    expect(bob.locator('#file-tree li[data-path="__pycache__"]')).to_have_count(0)
    bob.locator("#show-generated").check()
    expect(bob.locator('#file-tree li[data-path="__pycache__"]')).to_have_text("__pycache__")
    each_look(bob, screenshot, "runs-partner-console")
    bob.locator("#show-generated").uncheck()
    # Files made in the Shell reach the partner's tree while the Shell stays open.
    shell = open_shell(ada)
    ada.keyboard.type("echo notes > from_the_shell.txt\n")
    expect(bob.locator('#file-tree li[data-path="from_the_shell.txt"]')).to_be_visible(timeout=20_000)


def test_each_new_import_is_installed(server_url, owner, open_as, screenshot):
    project_id = owner.post("/api/projects", json={"name": "packages", "template": "python"}).json()["id"]
    write(owner, project_id, "main.py", "import six\nprint('six is', six.__name__)\n")
    ada = open_as(OWNER, project_id)
    console = ada.locator("#console")
    run_from_editor(ada, "import six")
    expect(console).to_contain_text("six is six", timeout=INSTALL_TIMEOUT_MS)
    expect(ada.locator('#file-tree li[data-path="requirements.txt"]')).to_be_visible()
    for module, code in (("toml", "print(toml.dumps({'a': 1}))\n"), ("tabulate", "print(tabulate.tabulate([[1, 2]]))\n")):
        editor = ada.locator(".editor-host:not([hidden]) .cm-content")
        editor.click()
        ada.keyboard.press("Control+End")
        ada.keyboard.type(f"import {module}\n{code}")
        run_from_editor(ada, f"import {module}")
        expect(console).to_contain_text(f"Your code uses '{module}' and requirements.txt does not list {module} yet",
                                        timeout=30_000)
        expect(console).to_contain_text(re.compile(f"Successfully installed .*{module}-"), timeout=INSTALL_TIMEOUT_MS)
        expect(ada.locator("#run-summary")).to_contain_text("Finished", timeout=INSTALL_TIMEOUT_MS)
    expect(console).to_contain_text("a = 1")
    each_look(ada, screenshot, "runs-packages-installed")
    requirements = owner.get(f"/api/projects/{project_id}/files/content/requirements.txt").text.splitlines()
    assert [line.split("==")[0] for line in requirements] == ["six", "toml", "tabulate"], requirements
    assert all("==" in line for line in requirements), requirements
    # The Shell sees the environment runs use.
    shell = open_shell(ada)
    ada.keyboard.type("python3 -c 'import tabulate, toml; print(\"shell has\", tabulate.__name__)'\n")
    expect(shell.locator(".xterm-rows")).to_contain_text("shell has tabulate", timeout=20_000)
    ada.keyboard.type("python3 -m pip list 2>/dev/null | grep -i ^tabulate\n")
    version = next(line.split("==")[1] for line in requirements if line.startswith("tabulate=="))
    expect(shell.locator(".xterm-rows")).to_contain_text(re.compile(rf"tabulate\s+{re.escape(version)}"), timeout=20_000)
    screenshot(ada, "runs-packages-shell")


FLASK_APP = """from flask import Flask, request
from markupsafe import escape

app = Flask(__name__)


@app.route("/")
def home():
    name = request.args.get("name")
    greeting = f"<p id='greeting'>Hello, {escape(name)}!</p>" if name else ""
    return "<h1>Hello from Flask</h1><form><input name='name'><button>Greet</button></form>" + greeting


app.run(host="0.0.0.0", port=8080)
"""


def test_a_flask_app_shows_in_the_webview(server_url, owner, open_as, screenshot):
    """Flask installed on the first run, its page in the Webview (forms work), the viewer's Webview follows."""
    project_id = owner.post("/api/projects", json={"name": "webview", "template": "python"}).json()["id"]
    join(server_url, owner, project_id, "rjviewer", "viewer")
    write(owner, project_id, "main.py", FLASK_APP)
    ada, bob = open_as(OWNER, project_id), open_as("rjviewer", project_id)
    run_from_editor(ada, "Flask(__name__)")
    page = ada.frame_locator("#webview-frame")
    expect(page.locator("h1")).to_have_text("Hello from Flask", timeout=INSTALL_TIMEOUT_MS)
    expect(ada.locator("#run-summary")).to_contain_text("Serving on port 8080")
    expect(ada.locator("#webview-tab")).to_have_text("Webview :8080")
    expect(ada.locator("#webview-open")).to_have_attribute("href", re.compile(r"^/preview/[\w-]+/$"))
    page.locator("input[name=name]").fill("Ada")
    page.locator("button").click()
    expect(page.locator("#greeting")).to_have_text("Hello, Ada!")
    each_look(ada, screenshot, "runs-webview-flask")
    expect(bob.locator("#webview-tab")).to_be_visible(timeout=20_000)  # a viewer watching the run sees its page too
    bob.locator("#webview-tab").click()
    expect(bob.frame_locator("#webview-frame").locator("h1")).to_have_text("Hello from Flask")
    screenshot(bob, "runs-webview-viewer")
    ada.locator("#run").click()  # Stop
    expect(bob.locator("#webview-address")).to_contain_text("stopped serving", timeout=20_000)
    assert httpx.get(server_url + ada.locator("#webview-open").get_attribute("href")).status_code == 404
