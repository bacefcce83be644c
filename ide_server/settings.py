"""Server settings, read from `CODEYARD_*` environment variables (pydantic-settings)."""

import os
import secrets
import socket
import tempfile
import zlib
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SECRET_KEY_FILE = "secret_key"


class Settings(BaseSettings):
    """Everything the server can be configured with; defaults give a working single-user server."""

    # CODEYARD_SECRETS_DIR: a folder of files named like the variables (codeyard_database_url...), as Docker
    # secrets mount them at /run/secrets, so passwords stay out of the environment.
    model_config = SettingsConfigDict(env_prefix="CODEYARD_", extra="ignore", secrets_dir=os.environ.get("CODEYARD_SECRETS_DIR"))

    data_dir: Path = Path(".codeyard")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default is a SQLite file in the data dir."
    )
    secret_key: SecretStr | None = Field(
        default=None, description="Signs sessions and CSRF tokens; generated into the data dir if unset."
    )
    sandbox_backend: Literal["auto", "docker", "bwrap", "runners"] = "auto"  # runners: runner nodes via Redis
    runner_slots: int = Field(default=0, ge=0, le=256, description="With the runners backend: this replica is also a "
                              "runner node taking this many runs at once (through Redis, as any runner).")
    sandbox_warm_containers: int = Field(
        default=0, ge=0, le=64, description="Docker only: idle started containers kept ready for runs with the "
        "default limits, so a run starts in tens of milliseconds instead of half a second."
    )
    sandbox_max_running: int = Field(
        default_factory=lambda: max(4, 2 * (os.cpu_count() or 1)), ge=1, description="Runs running at once on this "
        "server (each gets at most one CPU); more wait in a queue served round-robin between users. Default: twice "
        "the CPUs, at least 4."
    )
    sandbox_max_running_per_user: int = Field(
        default=2, ge=1, description="Runs one user may have running at once: keep it below sandbox_max_running, so "
        "one user cannot hold every slot."
    )
    sandbox_max_runs_per_user: int = Field(
        default=8, ge=1, description="Runs one user may have waiting or running; more are refused (429)."
    )
    packages_dir: Path | None = Field(
        default=None, description="Installed package environments and pip's download cache; default <data_dir>/packages. "
        "Sandbox uids must be able to reach it (every parent folder searchable by others)."
    )
    redis_url: str | None = Field(default=None, description="Several replicas: collab fan-out and who runs the deployed apps.")
    replica_host: str | None = Field(
        default=None, description="How the other replicas reach this one (deploy calls and app traffic go to the one "
        "running the apps); default: the listen address, or this host's own address when listening on all interfaces."
    )
    worker_addresses: str | None = Field(
        default=None, description="Set by `codeyard serve --workers N` for its workers, not by hand: every worker's "
        "own address (host:port, comma-separated, in order). A project's collab sockets are served by one of them."
    )
    worker_index: int | None = Field(default=None, ge=0, description="Set by `codeyard serve --workers N`: which of "
                                     "worker_addresses this worker is.")
    redis_private: bool = Field(default=False, description="Set by `codeyard serve --workers N` when redis_url is its "
                                "own redis-server, started and stopped with the workers: only they ever use it.")
    llm_model: str | None = None
    llm_eager: bool = Field(default=True, description="Start loading the LLM's model in the background when the "
                            "server starts, so the assistant is ready when first asked; false: on the first request.")
    llm_grpc_port: int | None = Field(
        default=None, ge=0, le=65535, description="Also serve the LLM's KServe v2 gRPC API (Triton's "
        "GRPCInferenceService) on this port of `host` (0: any free one), for personal API tokens. Unset: no gRPC."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    allow_registration: bool = Field(default=True, description="Let anyone sign up (admins can always add users).")
    session_days: int = Field(default=14, ge=1)
    login_max_failures: int = Field(default=5, ge=1, description="Failed logins per user+IP per window.")
    login_window_seconds: int = Field(default=300, ge=1)
    password_min_length: int = Field(default=8, ge=1)
    max_file_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    max_upload_bytes: int = Field(default=50 * 1024 * 1024, ge=1, description="Zip upload, compressed and expanded.")
    max_upload_files: int = Field(default=5000, ge=1)
    secure_cookies: bool = Field(default=False, description="Mark cookies Secure (serve over HTTPS).")
    deploy_apps_port: int | None = Field(
        default=None, ge=0, le=65535, description="Also serve deployed apps on this port (0: any free one), "
        "straight from the socket: the fast path, and an origin apart from the IDE's. Unset: only /apps/ on the IDE's port."
    )
    deploy_apps_host: str | None = Field(
        default=None, description="Apps answer at {slug}.apps.<this> (e.g. example.org, or localhost:8001 with the apps "
        "port 8001); their URLs then use it. Point that wildcard name at the apps port."
    )

    @property
    def reachable_host(self) -> str:
        """How the other replicas reach this one: `replica_host`, else the listen address, else
        (listening on every interface) this host's own address."""
        if self.replica_host:
            return self.replica_host
        return self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostbyname(socket.gethostname())

    def rooms_worker(self, project_id: str) -> str | None:
        """Under `serve --workers`: the address of the worker that hosts this project's collab rooms, when
        it is another one (None: this one, or a server alone). One host per project keeps its editors'
        keystrokes in one process; spread over the workers, each sent one through Redis after storing it."""
        if not self.worker_addresses:
            return None
        return self._other_worker(zlib.crc32(project_id.encode()) % len(self.worker_addresses.split(",")))

    @property
    def worker_tag(self) -> str:
        """What begins this worker's Webview tokens under `serve --workers` (its index, two digits), so the
        others know where to send a request for one; empty for a server alone."""
        return f"{self.worker_index:02d}" if self.worker_addresses and self.worker_index is not None else ""

    def tagged_worker(self, token: str) -> str | None:
        """The address of the other worker whose tag begins a Webview token, if it is another's."""
        return self._other_worker(int(token[:2])) if self.worker_tag and token[:2].isdigit() else None

    def _other_worker(self, index: int) -> str | None:
        addresses = (self.worker_addresses or "").split(",")
        if self.worker_index is None or index == self.worker_index or index >= len(addresses):
            return None
        return addresses[index]

    @property
    def projects_dir(self) -> Path:
        return self.data_dir / "projects"

    @property
    def effective_packages_dir(self) -> Path:
        return self.packages_dir or self.data_dir / "packages"

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'codeyard.db').resolve()}"

    @property
    def secret(self) -> str:
        """The server key (`prepare`, which create_app runs, loads or creates it when not configured)."""
        if self.secret_key is None:
            raise RuntimeError("the secret key is not loaded: call Settings.prepare() first")
        return self.secret_key.get_secret_value()

    def prepare(self) -> "Settings":
        """Create the data dir and make sure a secret key exists; returns self for chaining."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.projects_dir.mkdir(exist_ok=True)
        if self.secret_key is None:
            self.secret_key = SecretStr(load_or_create_secret(self.data_dir / SECRET_KEY_FILE))
        return self


def load_or_create_secret(path: Path) -> str:
    """Read the key file, or create it readable by the owner only (mode 0600) on first start.

    The new key is written to a temporary file and hard-linked into place, so replicas starting
    together on a shared data dir all end up with the same, complete key.
    """
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mkstemp creates it 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process won the race: use its key
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if not key:
        raise ValueError(f"secret key file {path} is empty; delete it to generate a new one")
    return key
