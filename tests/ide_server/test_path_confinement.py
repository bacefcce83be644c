"""Hostile paths never leave the project: `..`, encoded traversal, absolute paths, NUL, symlinks, zip slip."""

import io
import os
import stat
import zipfile

import pytest

from ide_server import paths
from ide_server.errors import InvalidInput

HOSTILE = [
    "../outside.txt",
    "a/../../outside.txt",
    "..",
    "/etc/passwd",
    "a\\..\\..\\outside.txt",
    "a\x00b",
    "%2e%2e/outside.txt",
    "%2E%2E%2Foutside.txt",
    "%252e%252e/outside.txt",
    "x" * 256,
    "/".join(["abcdefgh"] * 130),
    "a\nb",
]


@pytest.mark.parametrize("path", HOSTILE)
def test_normalise_refuses_hostile_paths(path):
    with pytest.raises(InvalidInput):
        paths.normalise(path)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("a/b.txt", "a/b.txt"), ("./a//b/", "a/b"), ("dir/.hidden", "dir/.hidden"), ("..a/b..", "..a/b.."),
     ("100%.txt", "100%.txt"), ("ünï cødé.py", "ünï cødé.py")],
)
def test_normalise_keeps_ordinary_names(path, expected):
    assert paths.normalise(path) == expected


@pytest.mark.parametrize("raw", [b"bad\xffname.txt", b"new\nline", b"a\\b", b"%2e%2e", b"x%\xfe\x1b", b"caf\xc3\xa9 \xc3"])
def test_names_the_api_cannot_carry_are_escaped_and_lead_back(raw):
    name = os.fsdecode(raw)
    shown = paths.escape(name)
    assert paths.problem(name) and "\\" in shown and shown.encode()  # JSON can carry it
    assert paths.existing(shown) == name and paths.existing(f"dir/{shown}") == f"dir/{name}"
    assert paths.escape("ok/caf\u00e9.txt") == "ok/caf\u00e9.txt" and paths.problem("ok/caf\u00e9.txt") is None


@pytest.mark.parametrize("path", ["a\\x2e\\x2e", "\\x2e\\x2e/x", "a\\x2fb", "a\\x00", "a\\x41", "bad\\xzz", "../a\\xff",
                                  "/a\\xff", "a\\..\\..\\outside.txt"])
def test_an_escaped_path_names_only_what_the_tree_shows(path):
    """No traversal, separator, NUL or second spelling hides behind an escape."""
    with pytest.raises(InvalidInput):
        paths.existing(path)


@pytest.fixture
def project(new_user, settings):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "box"}).json()["id"]
    return alice, f"/api/projects/{pid}/files", settings.projects_dir / pid


URL_ATTACKS = ["..%2Foutside.txt", "%2e%2e/outside.txt", "%2e%2e%2foutside.txt", "a/%2e%2e/%2e%2e/outside.txt",
               "%252e%252e%252foutside.txt", "%2Fetc%2Fpasswd", "a%00b", "a%5C..%5C..%5Coutside.txt"]


@pytest.mark.parametrize("raw", URL_ATTACKS)
def test_encoded_traversal_in_urls_is_refused(project, raw):
    alice, files, root = project
    for response in (
        alice.get(f"{files}/content/{raw}"),
        alice.put(f"{files}/content/{raw}", content=b"pwned"),
        alice.delete(f"{files}/content/{raw}"),
    ):
        assert response.status_code in (400, 404), (raw, response.status_code, response.text)
        assert response.json()["detail"]
    assert not (root.parent / "outside.txt").exists()
    assert not (root.parent.parent / "outside.txt").exists()


@pytest.mark.parametrize("path", ["../outside.txt", "/tmp/outside.txt", "a/../../outside.txt", "a\x00b"])
def test_json_bodies_with_hostile_paths_are_refused(project, path):
    alice, files, root = project
    response = alice.post(files, json={"path": path, "content": "pwned"})
    assert response.status_code == 400 and response.json()["detail"]
    response = alice.post(f"{files}/move", json={"src": "main.py", "dst": path})
    assert response.status_code == 400
    response = alice.post(f"{files}/move", json={"src": path, "dst": "x.py"})
    assert response.status_code == 400
    assert (root / "main.py").exists()


def test_symlink_to_etc_planted_in_the_project_is_never_followed(project, tmp_path):
    alice, files, root = project
    os.symlink("/etc", root / "etc")
    os.symlink("/etc/hostname", root / "hostname")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("original")
    os.symlink(outside, root / "out")

    for path in ("etc/hostname", "etc/passwd", "hostname", "out/victim.txt"):
        response = alice.get(f"{files}/content/{path}")
        assert response.status_code == 400, path
        assert "outside the project" in response.json()["detail"]
    assert alice.put(f"{files}/content/out/victim.txt", content=b"pwned").status_code == 400
    assert alice.put(f"{files}/content/out/new.txt", content=b"pwned").status_code == 400
    assert alice.post(files, json={"path": "out/sub", "kind": "directory"}).status_code == 400
    assert alice.post(f"{files}/move", json={"src": "main.py", "dst": "out/main.py"}).status_code == 400
    assert alice.delete(f"{files}/content/out/victim.txt").status_code == 400
    assert (outside / "victim.txt").read_text() == "original"
    assert sorted(os.listdir(outside)) == ["victim.txt"]

    # The tree lists links as links without following them; the zip leaves them out.
    tree = {e["path"]: e["kind"] for e in alice.get(files).json()}
    assert tree["etc"] == tree["out"] == tree["hostname"] == "symlink"
    assert not any(p.startswith("etc/") for p in tree)
    names = zipfile.ZipFile(io.BytesIO(alice.get(f"{files}/zip").content)).namelist()
    assert "hostname" not in names and not any(n.startswith(("etc", "out")) for n in names)

    # Writing through a link that points out is refused; deleting a link leaves its target alone.
    hostname = open("/etc/hostname", "rb").read()
    assert alice.put(f"{files}/content/hostname", content=b"mine").status_code == 400
    assert open("/etc/hostname", "rb").read() == hostname
    assert alice.delete(f"{files}/content/out").status_code == 204
    assert (outside / "victim.txt").read_text() == "original"


def test_symlinks_inside_the_project_still_work(project):
    alice, files, root = project
    os.symlink("main.py", root / "alias.py")
    assert alice.get(f"{files}/content/alias.py").content == (root / "main.py").read_bytes()
    assert alice.put(f"{files}/content/alias.py", content=b"print(1)\n").status_code == 200
    assert (root / "main.py").read_bytes() == b"print(1)\n" and os.path.islink(root / "alias.py")


def _zip(entries: list[tuple[str, bytes]], symlink: tuple[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name), data)
        if symlink:
            info = zipfile.ZipInfo(symlink[0])
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, symlink[1])
    return buf.getvalue()


@pytest.mark.parametrize(
    "archive",
    [
        _zip([("ok.txt", b"fine"), ("../../zipslip.txt", b"pwned")]),
        _zip([("ok.txt", b"fine"), ("/tmp/zipslip.txt", b"pwned")]),
        _zip([("ok.txt", b"fine"), ("a/../../zipslip.txt", b"pwned")]),
        _zip([("ok.txt", b"fine"), ("..\\zipslip.txt", b"pwned")]),
        _zip([("ok.txt", b"fine")], symlink=("link", "/etc")),
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "backslash", "symlink-entry"],
)
def test_zip_slip_is_refused_before_anything_is_written(project, archive):
    alice, files, root = project
    response = alice.post(f"{files}/zip", content=archive)
    assert response.status_code == 400
    assert "refused" in response.json()["detail"] or "symlink" in response.json()["detail"]
    assert not (root / "ok.txt").exists()
    assert not (root / "link").exists()
    assert not any(p.name == "zipslip.txt" for p in root.parent.parent.rglob("zipslip.txt"))
    assert not os.path.exists("/tmp/zipslip.txt")


def test_zip_upload_through_a_planted_symlink_is_refused(project, tmp_path):
    alice, files, root = project
    os.symlink(tmp_path, root / "out")
    response = alice.post(f"{files}/zip", content=_zip([("out/evil.txt", b"pwned")]))
    assert response.status_code == 400
    assert not (tmp_path / "evil.txt").exists()


def test_special_files_planted_by_user_code_do_not_hang_the_server(project):
    alice, files, root = project
    os.mkfifo(root / "pipe")
    response = alice.get(f"{files}/content/pipe")
    assert response.status_code == 400 and "not a regular file" in response.json()["detail"]
    assert "pipe" not in {e["path"] for e in alice.get(files).json()}
    assert "pipe" not in zipfile.ZipFile(io.BytesIO(alice.get(f"{files}/zip").content)).namelist()
