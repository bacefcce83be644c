"""Workspace speed in a real Chromium: page load to interactive and keystroke-to-remote-render latency.

Starts `codeyard serve` (SQLite, temporary data dir), signs two users into two browser contexts on
one project and measures:
- load to interactive: navigation start until the editor shows the file and says "Synced"
  (baseline in the same run: the dashboard, whose bundle holds no editor);
- remote render: a key pressed in context A (keydown time) until the character appears in context B's
  editor DOM (MutationObserver), one keystroke at a time (baseline: the same key's local render in A);
- the gzip size of the JavaScript each page loads (from the Vite manifest).
Goals: workspace JS < 600 KB gzip, load < 1.5 s, remote p99 < 100 ms on loopback.

Usage: .venv/bin/python benchmarks/web_bench.py [--loads 10] [--keys 200]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "web")]

from browser_kit import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from serve_process import codeyard_serve  # noqa: E402

ASSETS = REPO / "ide_server" / "webassets"
PASSWORD = "correct horse battery"
INTERACTIVE = """() => {
    const state = document.getElementById('connection')?.dataset.state;
    const line = document.querySelector('.editor-host:not([hidden]) .cm-line');
    return state === 'synced' && line && line.textContent.length > 0;
}"""
WATCH_REMOTE = """() => {
    window.__arrivals = {};
    const content = document.querySelector('.editor-host:not([hidden]) .cm-content');
    new MutationObserver(() => {
        const now = performance.timeOrigin + performance.now();
        for (const match of content.textContent.matchAll(/k(\\d+);/g)) window.__arrivals[match[1]] ??= now;
    }).observe(content, {childList: true, subtree: true, characterData: true});
}"""
WATCH_LOCAL = """() => {
    window.__keydowns = []; window.__local = {};
    document.addEventListener('keydown', () => window.__keydowns.push(performance.timeOrigin + performance.now()), true);
    const content = document.querySelector('.editor-host:not([hidden]) .cm-content');
    new MutationObserver(() => {
        const now = performance.timeOrigin + performance.now();
        for (const match of content.textContent.matchAll(/k(\\d+);/g)) window.__local[match[1]] ??= now;
    }).observe(content, {childList: true, subtree: true, characterData: true});
}"""


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def js_sizes() -> dict[str, int]:
    """gzip bytes of the entry chunk (every page) and of each lazily loaded chunk."""
    manifest = json.loads((ASSETS / "manifest.json").read_text())
    sizes = {}
    for chunk in manifest.values():
        if chunk["file"].endswith(".js"):
            sizes[chunk["file"]] = len(gzip.compress((ASSETS / chunk["file"]).read_bytes(), 9))
    return sizes


def setup_users(url: str) -> str:
    """Two users, one project they both edit; returns the project id."""
    clients = []
    for username in ("benchowner", "benchpeer"):
        client = httpx.Client(base_url=url, timeout=30)
        client.post("/api/auth/register", json={"username": username, "password": PASSWORD}).raise_for_status()
        client.post("/api/auth/login", json={"username": username, "password": PASSWORD}).raise_for_status()
        client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
        clients.append(client)
    owner, peer = clients
    project = owner.post("/api/projects", json={"name": "bench", "template": "python"}).json()
    invite = owner.post(f"/api/projects/{project['id']}/invites", json={"role": "editor"}).json()
    peer.post(f"/api/invites/{invite['token']}/accept").raise_for_status()
    owner.put(f"/api/projects/{project['id']}/files/content/main.py", content=b"print('bench')\n").raise_for_status()
    return project["id"]


def signed_in_context(browser, url: str, username: str):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    context.request.post(url + "/api/auth/login", data={"username": username, "password": PASSWORD})
    return context


def time_to_interactive(page, target: str, ready: str) -> float:
    """Milliseconds from navigation start until `ready` (a JS predicate) holds."""
    page.goto(target, wait_until="commit")
    page.wait_for_function(ready, polling="raf", timeout=30000)
    return page.evaluate("performance.now()")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=10, help="page loads measured per page")
    parser.add_argument("--keys", type=int, default=200, help="keystrokes timed between the contexts")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    sizes = js_sizes()
    entry = min(sizes.values())
    print("gzip JavaScript per chunk:", ", ".join(f"{name} {size / 1024:.1f} KB" for name, size in sizes.items()))
    print(f"login/dashboard load {entry / 1024:.1f} KB; workspace loads {sum(sizes.values()) / 1024:.1f} KB (goal < 600 KB)")

    with tempfile.TemporaryDirectory() as data_dir, codeyard_serve(Path(data_dir)) as url:
        project_id = setup_users(url)
        workspace = f"{url}/projects/{project_id}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = signed_in_context(browser, url, "benchowner")
            page = context.new_page()
            cold = time_to_interactive(page, workspace, INTERACTIVE)  # empty HTTP cache, room not yet open
            print(f"first workspace load (cold browser cache, room opened on the server): {cold:.0f} ms")
            loads = {"dashboard": [], "workspace": []}
            for _ in range(args.loads):
                loads["dashboard"].append(time_to_interactive(page, f"{url}/dashboard", "() => document.querySelector('#my-projects li.project')"))
                loads["workspace"].append(time_to_interactive(page, workspace, INTERACTIVE))
            for name, values in loads.items():
                print(f"{name} load to interactive: median {statistics.median(values):.0f} ms, max {max(values):.0f} ms over {len(values)} loads")
            ratio = statistics.median(loads["workspace"]) / statistics.median(loads["dashboard"])
            print(f"workspace/dashboard load ratio: {ratio:.2f}x (goal: workspace < 1500 ms)")

            peer_context = signed_in_context(browser, url, "benchpeer")
            peer = peer_context.new_page()
            time_to_interactive(peer, workspace, INTERACTIVE)
            page.evaluate(WATCH_LOCAL)
            peer.evaluate(WATCH_REMOTE)
            page.locator(".cm-content").click()
            page.keyboard.press("Control+End")
            remote, local = [], []
            for index in range(args.keys):
                marker = f"k{index};"
                page.keyboard.type(marker[:-1])
                page.evaluate("window.__keydowns = []")
                page.keyboard.press(";")
                peer.wait_for_function(f"() => window.__arrivals['{index}'] !== undefined", polling="raf", timeout=10000)
                sent = page.evaluate("window.__keydowns[0]")
                remote.append(peer.evaluate(f"window.__arrivals['{index}']") - sent)
                local.append(page.evaluate(f"window.__local['{index}']") - sent)
            print(
                f"keystroke to remote render over {len(remote)} keys: p50 {percentile(remote, 0.5):.1f} ms, "
                f"p99 {percentile(remote, 0.99):.1f} ms (goal p99 < 100 ms)"
            )
            print(f"baseline, keystroke to local render: p50 {percentile(local, 0.5):.1f} ms, p99 {percentile(local, 0.99):.1f} ms")
            print(f"remote/local p50 ratio: {percentile(remote, 0.5) / max(percentile(local, 0.5), 0.01):.1f}x")
            browser.close()


if __name__ == "__main__":
    main()
