"""Each app kind, detected and deployed for real on bubblewrap, answers through the proxy."""

from __future__ import annotations

from deploy.conftest import deploy, new_project

STATIC = {"index.html": "<h1>Hello from a static site</h1>\n", "about/index.html": "<p>about us</p>\n"}


def test_a_static_site_answers_through_the_proxy(owner):
    project_id = new_project(owner, STATIC)
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "static"
    url = deployment["url"]
    assert url.startswith("/apps/")
    page = owner.client.get(url)
    assert page.status_code == 200 and "Hello from a static site" in page.text
    assert owner.client.get(f"{url}about/").text == "<p>about us</p>\n"
    assert owner.client.get(url.rstrip("/"), follow_redirects=False).status_code == 308
