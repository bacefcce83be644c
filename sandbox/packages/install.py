"""Installing packages (pip, npm) in the sandbox, into shared environments keyed by what they hold.

pip (or npm, with --ignore-scripts) runs in an ordinary bubblewrap run (its own uid, no capabilities, cgroup and rlimits, a
quota'd workspace, a cleared environment) whose only way out is the IndexProxy; the host's pip
configuration is not mounted and `--isolated` ignores any other. It installs with --target (--prefix) into
the run's workspace; the host copies the result out (never following links) into
packages_dir/envs/<hash of the requirements>, which runs then mount read-only (on PYTHONPATH, or as
/node_modules). A shared download cache (packages_dir/cache) is the one writable host folder an install sees.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name

from sandbox.backend import Backend, Mount, RunSpec
from sandbox.limits import MIB, Limits
from sandbox.packages.proxy import NPM_HOSTS, PYPI_HOSTS, SOCKET_NAME, IndexProxy
from sandbox.verdict import Verdict

PYPI_INDEX = "https://pypi.org/simple"
NPM_REGISTRY = "https://registry.npmjs.org/"
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
ENV_TARGET = "/packages"  # where a Python run sees its environment, read-only
NODE_TARGET = "/node_modules"  # where Node finds a Node run's packages (a parent of /workspace)
CACHE_TARGET = "/cache"
PROXY_TARGET = "/run/codeyard-proxy"
SOURCES_TARGET = "/sources"
SITE = "site"  # the --target folder inside an environment
PINS_FILE = "pins.txt"
INSTALL_LIMITS = Limits(cpu_seconds=300, wall_seconds=600, memory_bytes=1024 * MIB, pids=128, output_bytes=4 * MIB,
                        file_bytes=256 * MIB, open_files=1024, disk_bytes=768 * MIB, files_count=50000)

# Runs argv[2:] (with "{proxy}" replaced by the forwarder's URL) behind a loopback forwarder to the
# host's proxy socket (argv[1]). umask 0: the download cache is shared by installs running as different per-run uids.
FORWARD_AND_INSTALL = r"""
import os, socket, subprocess, sys, threading
def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
def serve(listener):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try: upstream.connect(sys.argv[1])
        except OSError: client.close(); continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()
listener = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=serve, args=(listener,), daemon=True).start()
os.umask(0)
proxy = "http://127.0.0.1:%d" % listener.getsockname()[1]
sys.exit(subprocess.call([arg.replace("{proxy}", proxy) for arg in sys.argv[2:]]))
"""


Ecosystem = Literal["python", "node"]


class InstallFailed(Exception):
    """pip or npm did not install the requirements; the message ends with what it said."""


@dataclass(frozen=True)
class Environment:
    """An installed environment: its folder (mount path/SITE) and the version of each package it holds."""

    path: Path
    pins: dict[str, str]  # name (canonical for Python) -> version
    ecosystem: Ecosystem = "python"

    @property
    def site(self) -> Path:
        return self.path / SITE

    def mount(self) -> Mount:
        if self.ecosystem == "node":
            return Mount(self.site / "node_modules", NODE_TARGET)
        return Mount(self.site, ENV_TARGET)

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": ENV_TARGET} if self.ecosystem == "python" else {}


def _installed(site: Path, ecosystem: Ecosystem) -> dict[str, str]:
    return _installed_node(site / "node_modules") if ecosystem == "node" else _installed_python(site)


def _installed_node(modules: Path) -> dict[str, str]:
    pins = {}
    for manifest in [*modules.glob("*/package.json"), *modules.glob("@*/*/package.json")]:
        try:
            data = json.loads(manifest.read_text())
            pins[str(data["name"])] = str(data["version"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return pins


def _installed_python(site: Path) -> dict[str, str]:
    pins = {}
    for info in site.glob("*.dist-info"):
        metadata = info / "METADATA"
        if metadata.is_file() and not metadata.is_symlink():
            headers = HeaderParser().parsestr(metadata.read_text(errors="replace"))
            if headers["Name"] and headers["Version"]:
                pins[canonicalize_name(headers["Name"])] = headers["Version"]
    return pins


class Installer:
    """Installs requirement lists into root/envs, once per distinct list; serialises same-list installs."""

    def __init__(self, backend: Backend, root: Path, *, index_url: str | None = PYPI_INDEX,
                 find_links: Path | None = None, limits: Limits = INSTALL_LIMITS) -> None:
        if index_url is None and find_links is None:
            raise ValueError("index_url or find_links: an installer needs somewhere to install from")
        self.backend, self.index_url, self.find_links, self.limits = backend, index_url, find_links, limits
        root = Path(root).absolute()
        if blocked := [p for p in (root, *root.parents) if p.exists() and not p.stat().st_mode & 0o001]:
            raise ValueError(f"packages_dir: sandbox uids cannot reach {root}: {blocked[-1]} is not searchable "
                             f"by others (chmod o+x it, or choose another packages_dir)")
        self.envs, self.cache = root / "envs", root / "cache"
        self.envs.mkdir(parents=True, exist_ok=True)
        os.chmod(self.envs, 0o711)
        self.cache.mkdir(parents=True, exist_ok=True)
        os.chmod(self.cache, 0o777)  # written by installs under changing per-run uids
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, requirements: Sequence[str], ecosystem: Ecosystem = "python") -> str:
        """The environment's name: a hash of the sorted requirements and where they come from."""
        source = [f"index={self.index_url}", f"links={self.find_links}"] if ecosystem == "python" else [NPM_REGISTRY]
        text = "\n".join([ecosystem, *source, *sorted(set(requirements))])
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def cached(self, requirements: Sequence[str], ecosystem: Ecosystem = "python") -> Environment | None:
        path = self.envs / self.key(requirements, ecosystem)
        if not (path / PINS_FILE).is_file():
            return None
        path = path.resolve()
        return Environment(path, _installed(path / SITE, ecosystem), ecosystem)

    async def install(self, requirements: Sequence[str], progress: Callable[[str], None] = lambda _: None,
                      ecosystem: Ecosystem = "python") -> Environment:
        """The environment for `requirements`: cached, or installed now with the installer's output sent to `progress`."""
        key = self.key(requirements, ecosystem)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (env := self.cached(requirements, ecosystem)) is not None:
                return env
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.envs))
            try:
                await self._sandboxed(staging, requirements, progress, ecosystem)
                pins = _installed(staging / SITE, ecosystem)
                (staging / PINS_FILE).write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
                os.chmod(staging, 0o755)
                os.rename(staging, self.envs / key)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return Environment(self.envs / key, pins, ecosystem)

    def alias(self, requirements: Sequence[str], env: Environment) -> None:
        """Let `requirements` (e.g. the same list, now pinned) find `env` without installing again."""
        link = self.envs / self.key(requirements)
        if not os.path.lexists(link):
            os.symlink(env.path.name, link)

    def _pip(self, requirements: Sequence[str]) -> list[str]:
        source = ["--index-url", self.index_url] if self.index_url else ["--no-index"]
        if self.find_links is not None:
            source += ["--find-links", SOURCES_TARGET]
        return ["python3", "-m", "pip", "--proxy", "{proxy}", "install", "--isolated", "--no-input",
                "--disable-pip-version-check", "--progress-bar", "off", "--no-warn-script-location", "--cert", CA_FILE, "--cache-dir", f"{CACHE_TARGET}/pip",
                "--target", f"/workspace/{SITE}", *source, "--", *requirements]

    @staticmethod
    def _npm(staging: Path, requirements: Sequence[str]) -> list[str]:
        for name in (".npmrc-user", ".npmrc-global"):  # empty: no host or user npm configuration
            (staging / name).write_text("")
        return ["npm", "install", "--prefix", f"/workspace/{SITE}", "--ignore-scripts", "--no-bin-links", "--no-audit",
                "--no-fund", "--no-update-notifier", "--userconfig", "/workspace/.npmrc-user", "--globalconfig",
                "/workspace/.npmrc-global", "--cafile", CA_FILE, "--cache", f"{CACHE_TARGET}/npm", "--registry",
                NPM_REGISTRY, "--proxy", "{proxy}", "--https-proxy", "{proxy}", "--", *requirements]

    async def _sandboxed(self, staging: Path, requirements: Sequence[str], progress: Callable[[str], None],
                         ecosystem: Ecosystem) -> None:
        async with IndexProxy(NPM_HOSTS if ecosystem == "node" else PYPI_HOSTS) as proxy:
            assert proxy.folder is not None
            mounts = [Mount(self.cache, CACHE_TARGET, writable=True), Mount(proxy.folder, PROXY_TARGET)]
            if self.find_links is not None and ecosystem == "python":
                mounts.append(Mount(self.find_links, SOURCES_TARGET))
            command = self._npm(staging, requirements) if ecosystem == "node" else self._pip(requirements)
            argv = ["python3", "-c", FORWARD_AND_INSTALL, f"{PROXY_TARGET}/{SOCKET_NAME}", *command]
            run = await self.backend.start(RunSpec(argv, staging, self.limits, {"PYTHONDONTWRITEBYTECODE": "1"},
                                                  mounts=tuple(mounts)))
            await run.close_stdin()
            tail = bytearray()
            try:
                async for chunk in run.chunks():
                    progress(chunk.data.decode("utf-8", "replace"))
                    tail = (tail + chunk.data)[-4000:]
                result = await run.result()
            except asyncio.CancelledError:  # stop the install too, and wait until it has cleaned up
                run.cancel()
                await run.result()
                raise
        if result.verdict == Verdict.OK and result.files_skipped:
            raise InstallFailed(f"installing {', '.join(requirements)} left files the environment cannot keep (links, "
                                f"or past the quota of {self.limits.files_count} files / {self.limits.disk_bytes // MIB} MiB): "
                                f"{', '.join(result.files_skipped[:5])}")
        if result.verdict != Verdict.OK or not (staging / SITE).is_dir():
            said = tail.decode("utf-8", "replace").strip()
            how = result.message or (f"signal {result.signal}" if result.signal else f"exit code {result.exit_code}")
            raise InstallFailed(f"installing {', '.join(requirements)} failed ({result.verdict.value}: {how})"
                                f"{': ' + said[-1500:] if said else ''}")
