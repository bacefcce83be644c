"""Project-wide search and single-file download: the Replit basics the files API serves."""

from urllib.parse import quote


def test_search_finds_lines_across_the_project(new_user, anon):
    alice, stranger = new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "search", "template": "python"}).json()["id"]
    files = f"/api/projects/{pid}/files"
    for path, data in {"main.py": b"import helper\nprint(helper.GREETING)\n", "pkg/helper.py": b"GREETING = 'Hi'\n# greeting\n",
                       "__pycache__/helper.txt": b"GREETING\n", "blob.bin": b"\0GREETING", "latin.txt": "greeting\xe9".encode("latin-1")}.items():
        assert alice.put(f"{files}/content/{path}", content=data).status_code == 200
    answer = alice.get(f"{files}/search", params={"q": "greeting"}).json()
    assert answer == {"truncated": False, "matches": [
        {"path": "latin.txt", "line": 1, "column": 1, "text": "greeting\ufffd"},
        {"path": "main.py", "line": 2, "column": 14, "text": "print(helper.GREETING)"},
        {"path": "pkg/helper.py", "line": 1, "column": 1, "text": "GREETING = 'Hi'"},
        {"path": "pkg/helper.py", "line": 2, "column": 3, "text": "# greeting"}]}
    exact = alice.get(f"{files}/search", params={"q": "GREETING", "case_sensitive": "true"}).json()["matches"]
    assert [(m["path"], m["line"]) for m in exact] == [("main.py", 2), ("pkg/helper.py", 1)]
    assert alice.get(f"{files}/search", params={"q": ""}).status_code == 422
    assert alice.get(f"{files}/search").status_code == 422
    assert stranger.get(f"{files}/search", params={"q": "x"}).status_code == 404
    assert anon.get(f"{files}/search", params={"q": "x"}).status_code == 401


def test_search_answers_are_bounded(new_user):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "many"}).json()["id"]
    lines = "".join(f"x{i} {'y' * 300}\n" for i in range(600)).encode()
    assert alice.put(f"/api/projects/{pid}/files/content/big.txt", content=lines).status_code == 200
    answer = alice.get(f"/api/projects/{pid}/files/search", params={"q": "x"}).json()
    assert answer["truncated"] is True and len(answer["matches"]) == 500
    assert len(answer["matches"][0]["text"]) == 200


def test_a_file_downloads_under_its_own_name(new_user):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "dl"}).json()["id"]
    name = "notes été.txt"
    assert alice.put(f"/api/projects/{pid}/files/content/docs/{quote(name)}", content=b"hello").status_code == 200
    answer = alice.get(f"/api/projects/{pid}/files/content/docs/{quote(name)}", params={"download": "true"})
    assert answer.content == b"hello"
    assert answer.headers["content-disposition"] == f"attachment; filename*=UTF-8''{quote(name)}"
    assert "content-disposition" not in alice.get(f"/api/projects/{pid}/files/content/docs/{quote(name)}").headers
