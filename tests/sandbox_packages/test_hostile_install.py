"""A malicious package's build code, run by pip in the install sandbox, gets nothing out of it.

The sdist's in-tree build backend is its setup.py, so pip runs it while preparing the build. It
tries to read /etc/shadow, the server's secret key file and environment, to write into another
project and the host's /tmp, and to reach a loopback listener of the host directly and through
the index proxy; then it fails on purpose so pip prints everything it found.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version
from sandbox_fixtures import make_spec

from sandbox.backends.bwrap import BwrapBackend
from sandbox.packages.install import Installer, InstallFailed
from sandbox.packages.proxy import PROXY_TARGET, SOCKET_NAME

FAKE_SECRET = "fake-secret-key-5b0c9e1d7a"
ATTACK = r'''
import os, socket
found = []
def attempt(name, action):
    try:
        found.append("%s=GOT %r" % (name, action()))
    except BaseException as exc:
        found.append("%s=refused (%s)" % (name, type(exc).__name__))
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("secret_file", lambda: open(SECRET_FILE).read())
attempt("secret_env", lambda: os.environ["CODEYARD_SECRET_KEY"])
attempt("pid1_environ", lambda: open("/proc/1/environ", "rb").read())
attempt("other_project", lambda: open(os.path.join(OTHER_PROJECT, "main.py"), "w").write("pwned"))
attempt("host_tmp", lambda: open(HOST_MARKER, "w").write("pwned"))
attempt("loopback", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3).send(b"pwned"))
def through_proxy():
    s = socket.socket(socket.AF_UNIX)
    s.connect(PROXY_SOCKET)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % PORT)
    answer = s.recv(100)
    if b" 200 " not in answer:
        raise PermissionError(answer)
    s.sendall(b"pwned")
    return answer
attempt("proxy_to_loopback", through_proxy)
raise SystemExit("evil-attack-ran: " + "; ".join(found))
'''


def sdist(folder: Path, name: str, setup_py: str) -> None:
    """NAME-0.1.tar.gz whose build backend is its setup.py."""
    files = {
        f"{name}-0.1/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{name}-0.1/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "setup"\nbackend-path = ["."]\n',
        f"{name}-0.1/setup.py": setup_py,
    }
    with tarfile.open(folder / f"{name}-0.1.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))


@pytest.fixture
def listener():
    """A loopback server of the host that records every connection it gets."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(b"connection")
            conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The host-side things the package goes after: a secret key file and env, another project, /tmp."""
    monkeypatch.setenv("CODEYARD_SECRET_KEY", FAKE_SECRET)
    data = Path(tempfile.mkdtemp(prefix="codeyard-victim-"))
    os.chmod(data, 0o777)  # only the sandbox may stand in the way, not the host's permissions
    (data / "secret_key").write_text(FAKE_SECRET)
    (data / "project").mkdir(mode=0o777)
    (data / "project" / "main.py").write_text("print('mine')\n")
    os.chmod(data / "project" / "main.py", 0o666)
    yield data
    shutil.rmtree(data)


async def test_malicious_setup_py_escapes_nothing(packages_root, host, listener, tmp_path):
    port, accepted = listener
    marker = Path(tempfile.gettempdir()) / f"codeyard-evil-{port}"
    settings = (f"SECRET_FILE = {str(host / 'secret_key')!r}\nOTHER_PROJECT = {str(host / 'project')!r}\n"
                f"HOST_MARKER = {str(marker)!r}\nPORT = {port}\nPROXY_SOCKET = {PROXY_TARGET + '/' + SOCKET_NAME!r}\n")
    wheelhouse = Path(tempfile.mkdtemp(prefix="codeyard-wheelhouse-"))
    os.chmod(wheelhouse, 0o755)
    try:
        sdist(wheelhouse, "evil", settings + ATTACK)
        installer = Installer(BwrapBackend(), packages_root, index_url=None, find_links=wheelhouse)
        said: list[str] = []
        with pytest.raises(InstallFailed) as failure:
            await installer.install(["evil"], said.append)
    finally:
        shutil.rmtree(wheelhouse)
    output = "".join(said) + str(failure.value)
    assert "evil-attack-ran" in output, output  # the hostile code did run, in the sandbox
    for attempt in ("shadow", "secret_file", "secret_env", "other_project", "loopback", "proxy_to_loopback"):
        assert f"{attempt}=refused" in output, output
    assert FAKE_SECRET not in output  # nor in /proc/1/environ, which it read
    assert accepted == []
    assert "host_tmp=GOT" in output and not marker.exists()  # it wrote to its own /tmp, not the host's
    assert (host / "project" / "main.py").read_text() == "print('mine')\n"
    assert list(installer.envs.iterdir()) == []


POISON_NAME = "codeyard-cache-poison-3f7a"
# An in-tree build backend that works (so its install succeeds), and on every hook tries to poison
# the shared download cache: write into it directly (in the sandbox and at its host path), and plant
# a fake `six` in its own downloads, under the genuine file name and as a newer version.
POISON = r'''
import io, os, zipfile
MODULE = NAME.replace("-", "_")

def wheel(files):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return out.getvalue()

def fake_six(version):
    info = "six-%s.dist-info/" % version
    return wheel({"six.py": "print('pwned')\n__version__ = %r\n" % version,
                  info + "METADATA": "Metadata-Version: 2.1\nName: six\nVersion: %s\n" % version,
                  info + "WHEEL": "Wheel-Version: 1.0\nGenerator: evil\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
                  info + "RECORD": ""})

def poison():
    os.makedirs("/workspace/downloads", exist_ok=True)
    for folder in ("/cache", HOST_SHARED, "/workspace/downloads"):
        for name, version in ((GENUINE, GENUINE_VERSION), ("six-99.0-py3-none-any.whl", "99.0")):
            try:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(fake_six(version))
            except OSError:
                pass

META = "Metadata-Version: 2.1\nName: %s\nVersion: 0.1\n" % NAME

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    poison()
    info = os.path.join(metadata_directory, MODULE + "-0.1.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(META)
    return os.path.basename(info)

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    poison()
    name = MODULE + "-0.1-py3-none-any.whl"
    info = MODULE + "-0.1.dist-info/"
    with open(os.path.join(wheel_directory, name), "wb") as f:
        f.write(wheel({MODULE + ".py": "VALUE = 1\n", info + "METADATA": META, info + "RECORD": "",
                       info + "WHEEL": "Wheel-Version: 1.0\nGenerator: evil\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}))
    return name
'''


def pypi_wheel_of_six() -> tuple[str, str, str]:
    """(file name, version, sha256) of six's newest wheel, as PyPI lists it (asked here, not by the code under test)."""
    answer = httpx.get("https://pypi.org/simple/six/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=30)
    wheels = [f for f in answer.json()["files"] if f["filename"].endswith(".whl") and not f.get("yanked")
              and not Version(f["filename"].split("-")[1]).is_prerelease]  # what pip picks for a bare "six"
    newest = max(wheels, key=lambda f: Version(f["filename"].split("-")[1]))
    return newest["filename"], newest["filename"].split("-")[1], newest["hashes"]["sha256"]


async def test_a_malicious_build_cannot_poison_the_shared_download_cache(packages_root, project):
    genuine, version, sha256 = pypi_wheel_of_six()
    installer = Installer(BwrapBackend(), packages_root / "poison", find_links=Path(tempfile.mkdtemp(prefix="codeyard-wheelhouse-")))
    os.chmod(installer.find_links, 0o755)
    try:
        settings = (f"NAME = {POISON_NAME!r}\nGENUINE = {genuine!r}\nGENUINE_VERSION = {version!r}\n"
                    f"HOST_SHARED = {str(installer.shared)!r}\n")
        sdist(installer.find_links, POISON_NAME, settings + POISON)
        poisoned = await installer.install([POISON_NAME])  # its build code ran while fetching and while building
    finally:
        shutil.rmtree(installer.find_links)
    assert canonicalize_name(POISON_NAME) in poisoned.pins
    assert os.listdir(installer.shared) == []  # not written by it, and nothing it downloaded was vouched for

    said: list[str] = []  # another project's install of six: the real one, now shared with later installs
    clean = await Installer(BwrapBackend(), packages_root / "poison").install(["six"], said.append)
    assert clean.pins == {"six": version}
    assert os.listdir(installer.shared) == [genuine]
    assert hashlib.sha256((installer.shared / genuine).read_bytes()).hexdigest() == sha256
    (project / "main.py").write_text("import six\nprint(six.__version__)\n")
    spec = dataclasses.replace(make_spec(project, ["python3", "main.py"]), env=clean.env(), mounts=(clean.mount(),))
    result = await BwrapBackend().run(spec)
    assert (result.verdict.value, result.stdout) == ("ok", f"{version}\n".encode()), result.stderr

    said = []  # a third install that needs six again takes it from the shared cache, without the index
    await Installer(BwrapBackend(), packages_root / "poison").install(["six==" + version], said.append)
    assert "Found in the shared download cache" in "".join(said), said
