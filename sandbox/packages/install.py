"""Installing packages (pip, npm) in the sandbox, into shared environments keyed by what they hold.

pip (or npm, with --ignore-scripts) runs in ordinary bubblewrap runs (their own uid, no capabilities, cgroup and
rlimits, a quota'd workspace, a cleared environment); the host's pip configuration is not mounted and
`--isolated` ignores any other. A Python install is two runs:

1. fetch: `pip download` (and the build requirements of each sdist) into the run's own folder, with the
   IndexProxy (proxy.py, on the machine the run lands on) as the only way out and the shared download
   cache (packages_dir/cache/pypi) read-only;
2. build: `pip install --no-index` from those downloads into --target, with no network at all.

Between them the host shares with later installs only the downloads whose sha256 the index publishes
(verify.py), so a hostile setup.py cannot poison another project's install. npm runs no package code
(--ignore-scripts), so it keeps its own writable cache (packages_dir/cache/npm).
The host copies the result out (never following links) into packages_dir/envs/<hash of the
requirements>, which runs then mount read-only (on PYTHONPATH, or as /node_modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name

from sandbox.backend import Backend, Mount, RunSpec
from sandbox.backends.bwrap import BwrapBackend
from sandbox.limits import MIB, Limits
from sandbox.packages.proxy import NPM_HOSTS, PYPI_HOSTS, behind_index_proxy
from sandbox.packages.verify import share_verified
from sandbox.verdict import Verdict

log = logging.getLogger(__name__)

PYPI_INDEX = "https://pypi.org/simple"
NPM_REGISTRY = "https://registry.npmjs.org/"
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
ENV_TARGET = "/packages"  # where a Python run sees its environment, read-only
NODE_TARGET = "/node_modules"  # where Node finds a Node run's packages (a parent of /workspace)
CACHE_TARGET = "/cache"
SOURCES_TARGET = "/sources"
SITE = "site"  # the --target folder inside an environment
DOWNLOADS = "downloads"  # the fetch run's --dest, inside the staging folder
PINS_FILE = "pins.txt"
INSTALL_LIMITS = Limits(cpu_seconds=300, wall_seconds=600, memory_bytes=1024 * MIB, pids=128, output_bytes=4 * MIB,
                        file_bytes=256 * MIB, open_files=1024, disk_bytes=768 * MIB, files_count=50000)

# `pip download`s the requirements after "--" into argv[1], then the build requirements of every sdist
# among the downloads (so the build run can work offline), each time trying the shared cache alone
# first (options argv[2], JSON) and the index only for what it lacks (options argv[3]).
FETCH = r"""
import json, os, subprocess, sys, tarfile, tomllib, zipfile
dest, offline, online = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
wanted = sys.argv[sys.argv.index("--") + 1:]
pip = [sys.executable, "-m", "pip", "download", "--isolated", "--no-input", "--disable-pip-version-check",
       "--progress-bar", "off", "--no-cache-dir", "--dest", dest]
def fetch(requirements):
    if subprocess.call(pip + offline + ["--", *requirements], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
        print("Found in the shared download cache: " + ", ".join(requirements), flush=True)
    elif code := subprocess.call(pip + online + ["--", *requirements]):
        sys.exit(code)
def pyproject(path):
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/pyproject.toml")]
            return archive.read(names[0]) if names else None
    with tarfile.open(path) as archive:
        for member in archive:
            if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/pyproject.toml"):
                return archive.extractfile(member).read()
def build_requires(path):
    default = ["setuptools>=40.8.0", "wheel"]
    try:
        text = pyproject(path)
        return default if text is None else tomllib.loads(text.decode()).get("build-system", {}).get("requires", default)
    except Exception:
        return default
fetch(wanted)
seen = set()
while todo := {f for f in os.listdir(dest) if f.endswith((".tar.gz", ".zip"))} - seen:
    seen |= todo
    if needs := sorted({r for f in todo for r in build_requires(os.path.join(dest, f))}):
        fetch(needs)
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
    pins: dict[str, str] = {}
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
                 find_links: Path | None = None, limits: Limits = INSTALL_LIMITS, proxy_where_run: bool = False) -> None:
        """proxy_where_run: installs run elsewhere (runner nodes, which share root) and the machine each lands on
        serves its index proxy, as its spec's index_hosts ask; else this process serves it."""
        if index_url is None and find_links is None:
            raise ValueError("index_url or find_links: an installer needs somewhere to install from")
        self.backend, self.index_url, self.find_links, self.limits = backend, index_url, find_links, limits
        self.proxy_where_run = proxy_where_run
        root = Path(root).absolute()
        if blocked := [p for p in (root, *root.parents) if p.exists() and not p.stat().st_mode & 0o001]:
            raise ValueError(f"packages_dir: sandbox uids cannot reach {root}: {blocked[-1]} is not searchable "
                             f"by others (chmod o+x it, or choose another packages_dir)")
        self.envs, self.shared, self.npm_cache = root / "envs", root / "cache" / "pypi", root / "cache" / "npm"
        folders = ((self.envs, 0o711), (self.shared.parent, 0o755), (self.shared, 0o755), (self.npm_cache, 0o777))
        for folder, mode in folders:
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, mode)  # npm's cache is written by installs under changing per-run uids; pypi by the host only
        shutil.rmtree(root / "cache" / "pip", ignore_errors=True)  # the writable pip cache of earlier versions: untrusted
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
            try:
                return await self._install(key, requirements, progress, ecosystem)
            except OSError as exc:  # this server's side of the install (its packages folder), not pip's
                if (env := self.cached(requirements, ecosystem)) is not None:
                    return env  # another server (replica, runner) installed the same list meanwhile
                raise InstallFailed(f"installing {', '.join(requirements)} failed on the server: its packages folder "
                                    f"could not be managed ({exc}); tell the server's administrator") from exc

    async def _install(self, key: str, requirements: Sequence[str], progress: Callable[[str], None],
                       ecosystem: Ecosystem) -> Environment:
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.envs))
        try:
            if ecosystem == "node":
                await self._sandboxed(staging, self._npm(staging, requirements), requirements, progress,
                                      (Mount(self.npm_cache, CACHE_TARGET, writable=True),), NPM_HOSTS)
            else:
                await self._pip(staging, requirements, progress)
            if not (staging / SITE).is_dir():
                raise InstallFailed(f"installing {', '.join(requirements)} installed nothing")
            pins = _installed(staging / SITE, ecosystem)
            (staging / PINS_FILE).write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
            os.chmod(staging, 0o755)
            os.rename(staging, self.envs / key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return Environment(self.envs / key, pins, ecosystem)

    def alias(self, requirements: Sequence[str], env: Environment) -> None:
        """Let `requirements` (e.g. the same list, now pinned) find `env` without installing again."""
        link = self.envs / self.key(requirements, env.ecosystem)
        if not os.path.lexists(link):
            os.symlink(env.path.name, link)

    async def _pip(self, staging: Path, requirements: Sequence[str], progress: Callable[[str], None]) -> None:
        """Fetch (network to the index only), share what the index vouches for, then build offline."""
        sources = ["--find-links", SOURCES_TARGET] if self.find_links is not None else []
        offline = ["--no-index", "--find-links", CACHE_TARGET]
        online = [*(["--index-url", self.index_url] if self.index_url else ["--no-index"]), "--find-links", CACHE_TARGET,
                  *sources, "--proxy", "{proxy}", "--cert", CA_FILE]
        fetch = ["python3", "-c", FETCH, f"/workspace/{DOWNLOADS}", json.dumps(offline), json.dumps(online), "--", *requirements]
        mounts = (Mount(self.shared, CACHE_TARGET), *([Mount(self.find_links, SOURCES_TARGET)] if self.find_links else []))
        await self._sandboxed(staging, fetch, requirements, progress, mounts, PYPI_HOSTS)
        await share_verified(staging / DOWNLOADS, self.shared, self.index_url)
        build = ["python3", "-m", "pip", "install", "--isolated", "--no-input", "--disable-pip-version-check",
                 "--progress-bar", "off", "--no-warn-script-location", "--no-cache-dir", "--no-index",
                 "--find-links", f"/workspace/{DOWNLOADS}", "--target", f"/workspace/{SITE}", "--", *requirements]
        await self._sandboxed(staging, build, requirements, progress)
        shutil.rmtree(staging / DOWNLOADS)

    @staticmethod
    def _npm(staging: Path, requirements: Sequence[str]) -> list[str]:
        for name in (".npmrc-user", ".npmrc-global"):  # empty: no host or user npm configuration
            (staging / name).write_text("")
        return ["npm", "install", "--prefix", f"/workspace/{SITE}", "--ignore-scripts", "--no-bin-links", "--no-audit",
                "--no-fund", "--no-update-notifier", "--userconfig", "/workspace/.npmrc-user", "--globalconfig",
                "/workspace/.npmrc-global", "--cafile", CA_FILE, "--cache", CACHE_TARGET, "--registry",
                NPM_REGISTRY, "--proxy", "{proxy}", "--https-proxy", "{proxy}", "--", *requirements]

    async def _sandboxed(self, staging: Path, command: list[str], requirements: Sequence[str],
                         progress: Callable[[str], None], mounts: tuple[Mount, ...] = (),
                         hosts: frozenset[str] | None = None) -> None:
        """Run `command` over staging, with a way out to `hosts` through the index proxy or with no network at all."""
        spec = RunSpec(command, staging, self.limits, {"PYTHONDONTWRITEBYTECODE": "1"}, mounts=mounts,
                       index_hosts=hosts or frozenset())
        async with contextlib.AsyncExitStack() as stack:
            if not self.proxy_where_run:
                spec = await stack.enter_async_context(behind_index_proxy(spec))
            run = await self.backend.start(spec)
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
        if result.verdict != Verdict.OK:
            said = tail.decode("utf-8", "replace").strip()
            how = result.message or (f"signal {result.signal}" if result.signal else f"exit code {result.exit_code}")
            raise InstallFailed(f"installing {', '.join(requirements)} failed ({result.verdict.value}: {how})"
                                f"{': ' + said[-1500:] if said else ''}")


def runners_installer(backend: Backend, packages_dir: Path) -> Installer | None:
    """The installer for the runners backend: installs run on runner nodes, which share packages_dir and each serve
    the index proxy of the installs they run (so a runner on another machine installs too)."""
    try:
        return Installer(backend, packages_dir, proxy_where_run=True)
    except ValueError as exc:
        log.warning("package installs are off: %s", exc)
        return None


def bubblewrap_installer(packages_dir: Path) -> Installer | None:
    """The installer runs and deploys use, or None (logged) where installs cannot run.

    Installs run under bubblewrap whichever backend runs programs (Docker mounts the environments too):
    their only network is the host-side index proxy's Unix socket, which a bwrap run reaches as a bind."""
    if (reason := BwrapBackend.unavailable_reason()) is not None:
        log.warning("package installs are off: %s", reason)
        return None
    try:
        return Installer(BwrapBackend(), packages_dir)
    except ValueError as exc:
        log.warning("package installs are off: %s", exc)
        return None
