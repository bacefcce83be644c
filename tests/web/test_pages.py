"""The browser pages: shells load hashed assets, caching is right, and a user can get going."""

import re

import httpx
from playwright.sync_api import expect

from browser_kit import api_client, each_look, editor_text, signed_in_context, wait_for_file

PASSWORD = "correct horse battery"


def test_page_shell_loads_hashed_assets_cached_forever(server_url):
    page = httpx.get(server_url + "/login")
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-cache"
    script = re.search(r'<script type="module" src="(/static/assets/main-[\w-]+\.js)"', page.text)
    assert script, page.text
    asset = httpx.get(server_url + script.group(1))
    assert asset.status_code == 200
    assert "immutable" in asset.headers["cache-control"]
    assert "javascript" in asset.headers["content-type"]


def test_root_is_the_landing_page_for_visitors_and_the_dashboard_for_users(server_url):
    visitor = httpx.get(server_url + "/", follow_redirects=False)
    assert visitor.status_code == 200 and 'data-page="landing"' in visitor.text
    user = api_client(server_url, "rootuser").get("/", follow_redirects=False)
    assert user.status_code == 303
    assert user.headers["location"] == "/dashboard"


def test_register_create_project_edit_and_reload(server_url, browser, screenshot):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.goto(server_url + "/dashboard")
    expect(page).to_have_url(re.compile(r"/login\?next=/dashboard"))

    # The front page says what Codeyard is and leads to the sign-up form.
    page.goto(server_url + "/")
    expect(page.locator("main.landing h1")).to_contain_text("together")
    for feature in ("Edit together, live", "Run in sandboxes", "Tutorials", "One-click deploy", "AI help"):
        expect(page.locator(".landing-features h2", has_text=feature)).to_be_visible()
    expect(page.locator("#landing-sign-in")).to_have_attribute("href", "/login")
    each_look(page, screenshot, "landing")
    page.locator("#landing-sign-up").click()
    expect(page).to_have_url(re.compile(r"/register$"))
    page.fill("input[name=username]", "ada")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/dashboard$"))
    expect(page.get_by_text("Signed in as ada")).to_be_visible()
    page.goto(server_url + "/")  # signed in, the front page is the dashboard
    expect(page).to_have_url(re.compile(r"/dashboard$"))

    page.fill("input[name=name]", "hello-world")
    page.select_option("select[name=template]", "python")
    page.click("form.create button[type=submit]")
    project = page.locator("#my-projects li.project", has_text="hello-world")
    expect(project).to_be_visible()
    screenshot(page, "dashboard-with-project")

    project.get_by_role("link", name="hello-world").click()
    expect(page).to_have_url(re.compile(r"/projects/[\w-]+$"))
    expect(page.locator("#connection")).to_have_text("Synced")
    editor = page.locator(".cm-content")
    expect(editor).not_to_have_text("")
    editor.click()
    page.keyboard.press("Control+Home")
    page.keyboard.type('print("edited in the browser")\n')
    expect(page.locator("#connection")).to_have_text("Synced")
    page.reload()
    expect(page.locator(".cm-content")).to_contain_text('print("edited in the browser")')
    screenshot(page, "project-file-saved")
    context.close()


def test_wrong_password_shows_a_readable_message(server_url, browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(server_url + "/login")
    page.fill("input[name=username]", "nobody-here")
    page.fill("input[name=password]", "wrong password")
    page.click("button[type=submit]")
    error = page.locator(".status-error")
    expect(error).to_be_visible()
    assert "{" not in error.inner_text()
    context.close()


def test_dashboard_fits_a_phone_without_failed_requests(server_url, browser, screenshot):
    """On a phone every project's Delete and the Sign out button are on screen, nothing scrolls sideways, and
    loading the page asks for nothing that is not there (the favicon included)."""
    owner = api_client(server_url, "phoneuser")
    owner.post("/api/projects", json={"name": "a-rather-long-project-name-for-a-small-screen"}).raise_for_status()
    width = 390
    context = signed_in_context(browser, server_url, "phoneuser", width=width, height=844)
    page = context.new_page()
    failed = []
    page.on("response", lambda response: response.status >= 400 and failed.append(response.url))
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.goto(server_url + "/dashboard")
        expect(page.locator("#my-projects li.project")).to_have_count(1)
        for button in (page.locator("li.project button", has_text="Delete"), page.locator("header button", has_text="Sign out")):
            box = button.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        screenshot(page, f"dashboard-{scheme}-phone")
    assert failed == []
    context.close()


def test_settings_change_the_editor_and_the_account(server_url, browser, screenshot):
    """Indentation, font size and Vim key bindings chosen in Settings are what the editor uses (and follow at once in
    an open workspace when changed in another tab); the password and API tokens are managed there too."""
    owner = api_client(server_url, "settingsuser")
    project_id = owner.post("/api/projects", json={"name": "indents"}).json()["id"]
    owner.put(f"/api/projects/{project_id}/files/content/main.py", content=b"x = 1\n").raise_for_status()
    context = signed_in_context(browser, server_url, "settingsuser", width=1366, height=768)
    page = context.new_page()
    page.goto(server_url + "/dashboard")
    page.locator("#settings-link").click()
    page.select_option("#setting-indent", "8")  # (CodeMirror's own default is 2, ours 4)
    page.select_option("#setting-fontSize", "18")
    page.select_option("#setting-keys", "vim")
    page.select_option("#setting-theme", "dark")
    page.locator("#editor-settings button[type=submit]").click()
    expect(page.locator("#editor-status")).to_contain_text("Saved")
    page.locator("#password-form input[name=current]").fill(PASSWORD)
    page.locator("#password-form input[name=new]").fill("an even better password")
    page.locator("#password-form button").click()
    expect(page.locator("#password-status")).to_have_text("Password changed. Your other browsers were signed out.")
    page.get_by_label("Token name").fill("my script")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#new-token")).to_have_text(re.compile(r"^\S{20,}$"))
    expect(page.locator('#tokens li[data-token="my script"]')).to_be_visible()
    screenshot(page, "settings-dark-laptop")
    token = page.locator("#new-token").text_content()
    assert httpx.get(server_url + "/api/me", headers={"Authorization": f"Bearer {token}"}).json()["username"] == "settingsuser"

    workspace = context.new_page()
    workspace.goto(f"{server_url}/projects/{project_id}")
    editor = workspace.locator(".editor-host:not([hidden]) .cm-content")
    expect(editor).to_contain_text("x = 1")
    assert workspace.evaluate("document.documentElement.dataset.theme") == "dark"
    assert workspace.locator(".editor-host:not([hidden]) .cm-editor").evaluate("e => getComputedStyle(e).fontSize") == "18px"
    live_keys = workspace.locator(".editor-host:not([hidden]) .cm-editor")

    def main_py_becomes(text: str) -> None:
        wait_for_file(context, server_url, project_id, "main.py", text)  # the collaborative document, as saved

    def switch_keys(keys: str) -> None:
        """Chosen in the Settings tab; the open editor follows at once."""
        page.select_option("#setting-keys", keys)
        page.locator("#editor-settings button[type=submit]").click()
        expect(live_keys).to_have_attribute("data-keys", keys)

    # Vim: gg goes to the top, o opens a line below, Escape leaves insert mode, dd deletes a line, u undoes that.
    expect(live_keys).to_have_attribute("data-keys", "vim")
    editor.click()
    workspace.keyboard.type("ggo")
    workspace.keyboard.type("if x:\n")
    workspace.keyboard.type("y = 2")
    workspace.keyboard.press("Escape")
    expect(workspace.locator(".editor-host:not([hidden]) .cm-line").nth(2)).to_have_text("        y = 2")  # eight spaces, as chosen
    main_py_becomes("x = 1\nif x:\n        y = 2\n")
    workspace.wait_for_timeout(600)  # past the undo manager's 500 ms merge window, so that u undoes the dd alone
    workspace.keyboard.type("ggdd")
    main_py_becomes("if x:\n        y = 2\n")
    workspace.keyboard.type("u")
    main_py_becomes("x = 1\nif x:\n        y = 2\n")
    expect(workspace.locator(".cm-vim-panel")).not_to_contain_text("VISUAL")  # back in normal mode, nothing selected
    screenshot(workspace, "settings-vim-dark-laptop")
    # Back to the default bindings: the editor types letters again.
    switch_keys("default")
    workspace.keyboard.press("Control+End")
    workspace.keyboard.type("z = 3")
    main_py_becomes("x = 1\nif x:\n        y = 2\nz = 3")
    # Emacs: Ctrl+A goes to the line's start (not select all), Ctrl+K cuts to its end.
    switch_keys("emacs")
    workspace.keyboard.press("Control+a")
    workspace.keyboard.press("Control+k")
    main_py_becomes("x = 1\nif x:\n        y = 2\n")
    assert editor_text(workspace) == "x = 1\nif x:\n        y = 2\n"
    context.close()
