"""The workspace in real browsers: two people editing one file, the live tree, runs, roles, reload; and the Replit
basics: download the project as a zip and a single file, search across the project, find/replace in a file."""

import json
import re
import zipfile

import httpx
import pytest
from playwright.sync_api import expect

from browser_kit import api_client, each_look, editor_text, join, open_shell, signed_in_context, workspace_pages

OWNER, EDITOR, VIEWER = "wsowner", "wseditor", "wsviewer"
PROMPT_ANSWERS: dict = {}


@pytest.fixture(scope="module")
def project_id(server_url) -> str:
    """A Python project owned by OWNER, with EDITOR as editor and VIEWER as viewer (joined by invite links)."""
    owner = api_client(server_url, OWNER)
    project = owner.post("/api/projects", json={"name": "pair", "template": "python"}).json()
    for username, role in ((EDITOR, "editor"), (VIEWER, "viewer")):
        join(server_url, owner, project["id"], username, role)
    owner.put(f"/api/projects/{project['id']}/files/content/main.py", content=b'print("hello")\n').raise_for_status()
    return project["id"]


@pytest.fixture
def open_as(server_url, browser, project_id):
    """open_as(username) -> a page showing the project's workspace, signed in as that user."""
    with workspace_pages(browser, server_url) as open_page:
        def open_with_prompts(username: str, width: int = 1280, height: int = 720):
            page = open_page(username, project_id, width, height)
            page.on("dialog", lambda dialog: dialog.accept(PROMPT_ANSWERS.get(page, "")))
            return page

        yield open_with_prompts


def answer_next_prompt(page, text: str) -> None:
    """What the page's next prompt() gets typed into it (confirm() dialogs are accepted)."""
    PROMPT_ANSWERS[page] = text


def test_two_people_edit_one_file_at_once(open_as, screenshot):
    ada, bob = open_as(OWNER), open_as(EDITOR)
    for page in (ada, bob):
        expect(page.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text('print("hello")')
    ada.locator(".cm-content").click()
    bob.locator(".cm-content").click()
    ada.keyboard.press("Control+End")
    bob.keyboard.press("Control+Home")
    ada.keyboard.type("print('from ada')\n")
    bob.keyboard.type("# from bob\n")
    for page in (ada, bob):
        expect(page.locator(".cm-content")).to_contain_text("from ada")
        expect(page.locator(".cm-content")).to_contain_text("from bob")
    assert editor_text(ada) == editor_text(bob)
    assert editor_text(ada).startswith("# from bob\n")
    # Each sees the other's cursor, labelled with the other's name, and the other's avatar.
    expect(ada.locator(".cm-ySelectionInfo", has_text=EDITOR)).to_have_count(1)
    expect(bob.locator(".cm-ySelectionInfo", has_text=OWNER)).to_have_count(1)
    expect(ada.locator(f'#presence .avatar[data-user="{EDITOR}"][data-file="main.py"]')).to_be_visible()
    screenshot(ada, "workspace-two-editors")

    # Undo is per user: Bob's undo removes his line, not Ada's.
    bob.keyboard.press("Control+z")
    expect(ada.locator(".cm-content")).not_to_contain_text("from bob")
    expect(ada.locator(".cm-content")).to_contain_text("from ada")

    # A reload finds the text as it was, and the same tab open.
    ada.reload()
    expect(ada.locator(".tab.active")).to_have_attribute("data-path", "main.py")
    expect(ada.locator(".cm-content")).to_contain_text("from ada")
    assert editor_text(ada) == editor_text(bob)


def test_file_tree_updates_live_for_everyone(open_as, screenshot):
    ada, bob = open_as(OWNER), open_as(EDITOR)
    answer_next_prompt(ada, "notes/todo.md")
    ada.click("#new-file")
    expect(bob.locator('#file-tree li[data-path="notes/todo.md"]')).to_be_visible()
    expect(ada.locator(".tab.active")).to_have_attribute("data-path", "notes/todo.md")

    answer_next_prompt(ada, "notes/done.md")
    ada.locator('#file-tree li[data-path="notes/todo.md"]').hover()
    ada.locator('#file-tree li[data-path="notes/todo.md"] .rename').click()
    expect(bob.locator('#file-tree li[data-path="notes/done.md"]')).to_be_visible()
    expect(bob.locator('#file-tree li[data-path="notes/todo.md"]')).to_have_count(0)
    expect(ada.locator(".tab.active")).to_have_attribute("data-path", "notes/done.md")
    # Each file shows its type's icon; a folder folds and unfolds (for this person only).
    expect(bob.locator('#file-tree li[data-path="main.py"] .file-icon[data-type="python"]')).to_have_count(1)
    expect(bob.locator('#file-tree li[data-path="notes/done.md"] .file-icon[data-type="markdown"]')).to_have_count(1)
    folder = bob.locator('#file-tree li[data-path="notes"] .folder')
    expect(folder).to_have_attribute("aria-expanded", "true")
    folder.click()
    expect(bob.locator('#file-tree li[data-path="notes/done.md"]')).to_have_count(0)
    expect(folder).to_have_attribute("aria-expanded", "false")
    expect(ada.locator('#file-tree li[data-path="notes/done.md"]')).to_be_visible()
    folder.click()
    expect(bob.locator('#file-tree li[data-path="notes/done.md"]')).to_be_visible()
    screenshot(bob, "workspace-tree-live")

    ada.locator("#upload-input").set_input_files([{"name": "data.txt", "mimeType": "text/plain", "buffer": b"1 2 3\n"}])
    expect(bob.locator('#file-tree li[data-path="data.txt"]')).to_be_visible()
    expect(ada.locator("#message")).to_have_text("Uploaded 1 file.")

    bob.locator('#file-tree li[data-path="notes"]').hover()
    bob.locator('#file-tree li[data-path="notes"] .delete').click()
    expect(ada.locator('#file-tree li[data-path="notes/done.md"]')).to_have_count(0)
    expect(ada.locator('.tab[data-path="notes/done.md"]')).to_have_count(0)
    expect(ada.locator("#message")).to_contain_text("was deleted")


def test_viewer_watches_but_cannot_edit(open_as, screenshot):
    ada, viv = open_as(OWNER), open_as(VIEWER)
    expect(viv.locator("#role")).to_have_text("viewer")
    for hidden in ("#new-file", "#upload", "#file-tree .delete", "#file-tree .rename"):
        expect(viv.locator(hidden)).to_have_count(0)
    expect(viv.locator("#run")).to_be_hidden()
    before = editor_text(viv)
    viv.locator(".cm-content").click()
    viv.keyboard.type("vandalism")
    assert editor_text(viv) == before
    ada.locator(".cm-content").click()
    ada.keyboard.press("Control+End")
    ada.keyboard.type("# seen by the viewer\n")
    expect(viv.locator(".cm-content")).to_contain_text("seen by the viewer")
    assert "vandalism" not in editor_text(ada)
    screenshot(viv, "workspace-viewer")


def test_run_a_program_that_reads_input(open_as, screenshot):
    ada = open_as(OWNER)
    ada.locator(".cm-content").click()
    ada.keyboard.press("Control+a")
    ada.keyboard.type('name = input("Your name? ")\nprint("Hello, " + name + "!")\n')
    ada.keyboard.press("Control+Enter")
    console = ada.locator("#console")
    expect(console).to_contain_text("Your name?", timeout=20000)
    ada.locator("#console .xterm-helper-textarea").focus()
    ada.keyboard.type("Grace\n")
    expect(console).to_contain_text("Hello, Grace!", timeout=20000)
    assert console.locator(".xterm-rows").inner_text().count("Your name?") == 1, "Ctrl+Enter started one run"
    expect(ada.locator("#run-summary")).to_contain_text("Finished")
    expect(ada.locator("#run-summary")).to_contain_text(" s")
    screenshot(ada, "workspace-run-console")


def test_a_normal_session_answers_no_errors(server_url, browser, project_id):
    """Opening the workspace, running the program and opening files asks nothing that answers 4xx/5xx (a project
    with no deployment or lesson is no error) and logs no error in the browser's console."""
    owner = api_client(server_url, OWNER, register=False)
    owner.put(f"/api/projects/{project_id}/files/content/main.py", content=b'print("no errors here")\n').raise_for_status()
    owner.put(f"/api/projects/{project_id}/files/content/notes.md", content=b"# Notes\n").raise_for_status()
    context = signed_in_context(browser, server_url, OWNER)
    page = context.new_page()
    problems: list[str] = []
    page.on("response", lambda response: response.status >= 400 and problems.append(f"{response.status} {response.url}"))
    page.on("console", lambda message: message.type == "error" and problems.append(f"console: {message.text}"))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto(f"{server_url}/projects/{project_id}")
    expect(page.locator("#connection")).to_have_text("Synced")
    page.locator('#file-tree li[data-path="main.py"]').click()
    expect(page.locator(".cm-content")).to_contain_text("no errors here")
    page.click("#run")
    expect(page.locator("#console")).to_contain_text("no errors here", timeout=20000)
    expect(page.locator("#run-summary")).to_contain_text("Finished")
    page.locator('#file-tree li[data-path="notes.md"]').click()
    expect(page.locator(".tab.active")).to_have_attribute("data-path", "notes.md")
    expect(page.get_by_label("Contents of notes.md")).to_contain_text("# Notes")
    page.reload()  # and once more from the start, as after a break
    expect(page.locator("#connection")).to_have_text("Synced")
    context.close()
    assert problems == []


def test_shell_pane_runs_commands_in_the_sandbox(open_as, screenshot):
    ada = open_as(OWNER)
    shell = open_shell(ada)
    ada.keyboard.type("echo $((6*7))-from-the-shell; whoami\n")
    expect(shell.locator(".xterm-rows")).to_contain_text("42-from-the-shell", timeout=20000)
    assert "root" not in shell.locator(".xterm-rows").inner_text().split("42-from-the-shell", 1)[1]
    screenshot(ada, "workspace-shell")


def test_narrow_screen_stacks_panes(open_as, screenshot):
    page = open_as(OWNER, width=400, height=800)
    tree = page.locator("#file-tree").bounding_box()
    editor = page.locator("#editor").bounding_box()
    assert editor["y"] > tree["y"] and editor["width"] > 300
    page.click("#theme")
    expect(page.locator("html")).to_have_attribute("data-theme", re.compile("dark|light"))
    screenshot(page, "workspace-narrow")


def test_share_dialog_invites_and_changes_roles(open_as, server_url, browser, screenshot):
    ada = open_as(OWNER)
    ada.click("#share")
    dialog = ada.locator("#share-dialog")
    expect(dialog.locator(f'li[data-username="{EDITOR}"] select')).to_have_value("editor")
    dialog.locator("select[aria-label='Role for the invite link']").select_option("viewer")
    dialog.locator("#create-invite").click()
    expect(dialog.locator("#invite-link")).to_have_value(re.compile(r"/invite/"))
    screenshot(ada, "workspace-share-dialog")
    link = dialog.locator("#invite-link").input_value()

    # Someone new follows the link and joins as a viewer.
    guest = signed_in_context(browser, server_url, "wsnewcomer", register=True)
    page = guest.new_page()
    page.goto(link)
    page.get_by_role("button", name="Join project").click()
    expect(page.locator("#role")).to_have_text("viewer")

    # The owner makes them an editor; after a reload they can edit.
    ada.click("#share-close")
    ada.click("#share")
    dialog.locator('li[data-username="wsnewcomer"] select').select_option("editor")
    expect(dialog.locator(".status")).to_contain_text("wsnewcomer is now editor")
    page.reload()
    expect(page.locator("#role")).to_have_text("editor")
    expect(page.locator("#new-file")).to_be_visible()
    guest.close()


def test_restore_from_history_is_seen_by_both(open_as, screenshot):
    ada, bob = open_as(OWNER), open_as(EDITOR)
    ada.locator(".cm-content").click()
    ada.keyboard.press("Control+a")
    ada.keyboard.type("print('version one')\n")
    expect(bob.locator(".cm-content")).to_contain_text("version one")
    ada.click("#history")  # saved under a name: a bad one is refused with the rule, a good one shows in the list
    ada.fill("#checkpoint-name", "my first")
    ada.click("#checkpoint-save-as button")
    expect(ada.locator("#history-dialog .status")).to_contain_text("letters, digits")
    ada.fill("#checkpoint-name", "first-try")
    ada.click("#checkpoint-save-as button")
    expect(ada.locator("#history-dialog .status")).to_contain_text("saved as “first-try”")
    expect(ada.locator("#checkpoints li[data-version]").first.locator(".checkpoint-name")).to_have_text("first-try")
    screenshot(ada, "workspace-history-named")
    ada.click("#history-close")
    ada.locator(".cm-content").click()
    ada.keyboard.press("Control+a")
    ada.keyboard.type("print('version two')\n")
    expect(bob.locator(".cm-content")).to_contain_text("version two")
    ada.keyboard.press("Control+s")
    expect(ada.locator("#message")).to_contain_text("Checkpoint saved")

    ada.click("#history")
    checkpoints = ada.locator("#checkpoints li[data-version]")
    expect(checkpoints.nth(1)).to_be_visible()
    newest, older = checkpoints.nth(0), checkpoints.nth(1)
    expect(older.locator(".checkpoint-name")).to_have_text("first-try")
    newest.locator(".show-diff").click()
    expect(ada.locator("#diff .diff-add")).to_contain_text("version two")
    expect(ada.locator("#diff .diff-del")).to_contain_text("version one")
    screenshot(ada, "workspace-history-diff")
    older.locator(".restore").click()
    expect(ada.locator("#history-dialog .status")).to_contain_text("Restored main.py")
    for page in (ada, bob):
        expect(page.locator(".cm-content")).to_contain_text("version one")
        expect(page.locator(".cm-content")).not_to_contain_text("version two")
    assert editor_text(ada) == editor_text(bob)


def test_history_api_refuses_viewers_and_bad_versions(server_url, project_id):
    viewer = api_client(server_url, VIEWER, register=False)
    assert viewer.get(f"/api/projects/{project_id}/history").status_code == 200
    refused = viewer.post(f"/api/projects/{project_id}/history", json={})
    assert refused.status_code == 403 and "editor" in refused.json()["detail"]
    assert viewer.post(f"/api/projects/{project_id}/history/restore", json={"version": "abcd"}).status_code == 403
    newest = viewer.get(f"/api/projects/{project_id}/history").json()[0]["version"]
    named = viewer.post(f"/api/projects/{project_id}/history/{newest}/name", json={"name": "mine"})
    assert named.status_code == 403 and "editor" in named.json()["detail"]
    editor = api_client(server_url, EDITOR, register=False)
    for name, code in (("has space", 400), ("../up", 400), ("", 422), ("x" * 65, 422)):
        answer = editor.post(f"/api/projects/{project_id}/history", json={"name": name})
        assert answer.status_code == code, (name, answer.text)
    bad = viewer.get(f"/api/projects/{project_id}/history/diff", params={"old": "no such", "new": "HEAD"})
    assert bad.status_code == 400 and "version" in bad.json()["detail"]
    anonymous = httpx.get(f"{server_url}/api/projects/{project_id}/history")
    assert anonymous.status_code == 401


def test_events_socket_checks_access(server_url, project_id):
    """Anonymous callers and non-members are turned away; a member hears presence and file changes."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws_url = server_url.replace("http", "ws") + f"/ws/projects/{project_id}/events"
    stranger = api_client(server_url, "wsstranger")
    for headers, code in (({}, 4401), ({"Cookie": f"codeyard_session={stranger.cookies['codeyard_session']}"}, 4403)):
        with connect(ws_url, additional_headers={**headers, "Origin": server_url}) as socket:
            with pytest.raises(ConnectionClosed) as closed:
                socket.recv(timeout=10)
            assert closed.value.rcvd.code == code

    owner = api_client(server_url, OWNER, register=False)
    cookie = {"Cookie": f"codeyard_session={owner.cookies['codeyard_session']}", "Origin": server_url}
    with connect(ws_url, additional_headers=cookie) as socket:
        presence = json.loads(socket.recv(timeout=10))
        assert presence["type"] == "presence" and OWNER in [user["username"] for user in presence["users"]]
        owner.post(f"/api/projects/{project_id}/files", json={"path": "live.txt", "kind": "file"}).raise_for_status()
        event = json.loads(socket.recv(timeout=10))
        assert event == {"type": "files", "action": "create", "path": "live.txt", "to": None}


def test_anyone_can_read_a_public_project(server_url, browser, screenshot):
    owner = api_client(server_url, OWNER, register=False)
    project = owner.post("/api/projects", json={"name": "open-day", "template": "python"}).json()
    owner.put(f"/api/projects/{project['id']}/files/content/main.py", content=b'print("open to all")\n').raise_for_status()
    owner.patch(f"/api/projects/{project['id']}", json={"visibility": "public"}).raise_for_status()

    visitor = browser.new_context(viewport={"width": 1280, "height": 720})
    page = visitor.new_page()
    page.goto(f"{server_url}/projects/{project['id']}")
    expect(page.locator(".cm-content")).to_contain_text("open to all")
    expect(page.locator("#connection")).to_contain_text("Saved version")
    expect(page.locator("#run")).to_be_hidden()
    expect(page.locator("#new-file")).to_have_count(0)
    page.locator(".cm-content").click()
    page.keyboard.type("graffiti")
    expect(page.locator(".cm-content")).not_to_contain_text("graffiti")
    screenshot(page, "workspace-public-visitor")
    visitor.close()


BASICS_FILES = {"main.py": "from helper import greet\n\nprint(greet('world'))\n",
                "helper.py": "def greet(name):\n    return 'Hello, ' + name\n",
                "docs/notes.md": "# Notes\nCall greet() to say hello.\n"}


@pytest.fixture(scope="module")
def basics_project(server_url, project_id) -> str:
    """A project of three files (no template) owned by OWNER (registered for the pair's project)."""
    owner = api_client(server_url, OWNER, register=False)
    project_id = owner.post("/api/projects", json={"name": "basics"}).json()["id"]
    for path, text in BASICS_FILES.items():
        owner.put(f"/api/projects/{project_id}/files/content/{path}", content=text.encode()).raise_for_status()
    return project_id


@pytest.fixture
def basics_page(server_url, browser, basics_project):
    """The basics project's workspace as its owner, light, at laptop size."""
    with workspace_pages(browser, server_url) as open_page:
        yield open_page(OWNER, basics_project, 1366, 768, theme="light")


def test_download_the_project_and_a_file(basics_page, screenshot):
    page = basics_page
    with page.expect_download() as download:
        page.locator("#download-zip").click()
    assert download.value.suggested_filename.endswith(".zip")
    with zipfile.ZipFile(download.value.path()) as archive:
        assert {path: archive.read(path).decode() for path in BASICS_FILES} == BASICS_FILES
    item = page.locator('#file-tree li[data-path="helper.py"]')
    item.hover()
    with page.expect_download() as download:
        item.locator("a.download").click()
    assert download.value.suggested_filename == "helper.py"
    assert open(download.value.path()).read() == BASICS_FILES["helper.py"]
    each_look(page, screenshot, "basics-download")
    # The assistant's panel opens beside the console (whose traceback it explains), not over it.
    page.locator("#assistant-button").click()
    expect(page.locator("#assistant-panel")).to_be_visible()
    panel, console = page.locator("#assistant-panel").bounding_box(), page.locator("#console").bounding_box()
    assert console["x"] + console["width"] <= panel["x"], (console, panel)
    screenshot(page, "basics-assistant-beside-console")


def test_search_the_project_and_replace_in_a_file(basics_page, screenshot):
    page = basics_page
    page.locator("#project-search").fill("greet")
    page.keyboard.press("Enter")
    results = page.locator("#search-results")
    expect(results.locator("li.summary")).to_have_text("4 results in 3 files")
    expect(results.locator("li[data-path]")).to_have_count(4)
    results.locator('li[data-path="docs/notes.md"] button').click()
    expect(page.locator(".tab.active")).to_have_attribute("data-path", "docs/notes.md")
    expect(page.locator(".editor-host:not([hidden]) .cm-activeLine")).to_have_text("Call greet() to say hello.")
    each_look(page, screenshot, "basics-search")
    # Find and replace in the open file (CodeMirror's search panel).
    page.locator('#file-tree li[data-path="helper.py"] .file').click()
    expect(page.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text("def greet")
    page.locator(".editor-host:not([hidden]) .cm-content").click()
    page.keyboard.press("Control+f")
    panel = page.locator(".editor-host:not([hidden]) .cm-search")
    panel.locator("input[name=search]").fill("name")
    panel.locator("input[name=replace]").fill("who")
    panel.locator("button[name=replaceAll]").click()
    expect(page.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text("def greet(who):")
    assert editor_text(page) == "def greet(who):\n    return 'Hello, ' + who\n"
    screenshot(page, "basics-replace-light-laptop")
