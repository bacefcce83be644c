"""The container files: docker-compose.yml is valid and wires the proxy, app replicas, runners, PostgreSQL, Redis and LLM;
the Dockerfiles take their base, copy what exists, and the app runs as a non-root user."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_docker_compose_config_is_valid():
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.fail("docker-compose is not installed (make test installs it: apt-get install docker-compose)")
    result = subprocess.run(
        [compose, "-f", "docker-compose.yml", "config"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert {"proxy", "app1", "app2", "runner1", "runner2", "llm", "postgres", "redis"} == set(services)
    for name in ("app1", "app2"):
        app = services[name]
        env = app["environment"]
        # Runs go to the runners; the database URL (with its password) comes from a secret file, not the environment.
        assert env["CODEYARD_SANDBOX_BACKEND"] == "runners" and env["CODEYARD_SECRETS_DIR"] == "/run/secrets"
        assert "CODEYARD_DATABASE_URL" not in env and "codeyard_database_url" in str(app["secrets"])
        assert env["CODEYARD_REDIS_URL"].startswith("redis://")
        assert set(app["depends_on"]) == {"postgres", "redis", "llm"}
        assert app["healthcheck"]["test"] and app["volumes"]
    assert services["app1"]["environment"]["CODEYARD_PORT"] != services["app2"]["environment"]["CODEYARD_PORT"]
    for name in ("runner1", "runner2"):
        runner = services[name]
        assert runner["command"][:2] == ["codeyard", "runner"] and "SYS_ADMIN" in runner["cap_add"]
        assert runner["deploy"]["mode"] == "global" and runner["volumes"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert "llm serve" in " ".join(services["llm"]["command"])
    assert {service.get("network_mode") for service in services.values()} == {"host"}


def test_the_compose_file_is_a_valid_swarm_stack(tmp_path):
    """`docker stack config` (the loader `docker stack deploy` uses) takes the file: list-form depends_on, no
    compose-only keys where swarm needs others. It needs no engine."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.fail("the docker client is not installed")
    result = subprocess.run([docker, "stack", "config", "-c", "docker-compose.yml", "-c", "docker/swarm.yml"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path),
                                                        "DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert "unknown shorthand flag" not in result.stderr, f"{docker} has no `docker stack config` (Docker CLI 23 or later)"
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    runner = config["services"]["runner1"]
    assert runner["deploy"]["placement"]["constraints"] == ["node.labels.codeyard.runner == true"]
    # swarm takes no security_opt: the runner starts its worker container through the node's engine
    assert "--in-worker" in runner["command"] and any(v["target"] == "/var/run/docker.sock" for v in runner["volumes"])
    assert set(config["secrets"]) == {"codeyard_database_url", "codeyard_llm_api_key", "postgres_password"}


def test_dockerfiles_take_their_base_and_copy_what_exists():
    dockerfiles = [REPO / "Dockerfile", *sorted((REPO / "docker").glob("*.Dockerfile"))]
    assert len(dockerfiles) == 6
    for path in dockerfiles:
        text = path.read_text()
        assert re.search(r"^ARG BASE=\S+", text, re.M) and re.search(r"^FROM \$\{BASE\}", text, re.M), path
        for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
            for name in source.split():
                # a one-letter class (wheel[s]) matches what only `codeyard images build` brings
                assert "[" in name or (REPO / name).exists(), f"{path.name} copies {name}, which is missing"
    app = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", app, re.M)
    assert users and users[-1] not in ("root", "0")
    install = (REPO / "docker" / "install-codeyard.sh").read_text()
    assert "-c /tmp/pip/constraints.txt" in install
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_the_installed_package_carries_the_kernels_sources():
    """The CPU kernels compile on first use from the installed package (the LLM image): every source and header
    under llm_engine/layers/csrc must be package data."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["llm_engine"]
    sources = [p.relative_to(REPO / "llm_engine").as_posix() for p in (REPO / "llm_engine" / "layers" / "csrc").iterdir()
               if p.suffix in (".cpp", ".h")]
    assert sources and all(any(fnmatch.fnmatch(s, g) for g in globs) for s in sources), (sources, globs)
