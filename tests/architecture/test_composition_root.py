"""The composition root (`ide_server/wiring.py`) builds the shared services in dependency order, and a
missing dependency stops `create_app` with a clear error instead of a None at the first request."""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import fields

import pytest
from fastapi.testclient import TestClient

from ide_server import wiring
from ide_server.app import create_app
from ide_server.components import Component
from ide_server.settings import Settings
from ide_server.wiring import Builders

ORDER = [f.name for f in fields(Builders)]


def _inputs(step: str) -> list[str]:
    """The services a builder is built from: its protocol's keyword arguments (after `core`)."""
    protocol = getattr(wiring, str(Builders.__dataclass_fields__[step].type).removesuffix(" | None"))
    parameters = inspect.signature(protocol.__call__).parameters.values()
    return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]


def test_each_builder_comes_after_the_services_it_is_built_from():
    assert ORDER == ["events", "collab", "secrets", "runs", "deploys", "checker", "llm", "assistant"]
    for position, step in enumerate(ORDER):
        for needed in [*_inputs(step), *wiring.REQUIRED.get(step, ())]:
            assert needed in ORDER[:position], f"{step} is built from {needed}, which is built after it"
    assert _inputs("runs") == ["events", "collab", "secrets"] and _inputs("assistant") == ["llm"]


def test_the_whole_app_starts_its_services_in_that_order_and_reads_them_typed(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, sandbox_backend="bwrap", log_level="warning"))
    services = app.state.services
    assert services.started == [] and services.runs is None  # built while the app serves, not before
    with TestClient(app) as client:
        assert services.started == ORDER
        # each built from the ones before it: runs announce on the hub, checks run as runs, the assistant asks the model
        assert services.runs.announce == services.events.announce
        assert services.checker.runs is services.runs and services.assistant.llm is services.llm
        assert client.get("/readyz").status_code == 200
    app.state.engine.dispose()


@pytest.fixture
def plant():
    """Registers in-memory component modules for `component_specs`, removed afterwards."""
    planted: list[str] = []

    def add(name: str, component: Component) -> str:
        module = types.ModuleType(name)
        module.component = component  # type: ignore[attr-defined]
        sys.modules[name] = module
        planted.append(name)
        return f"{name}:component"

    yield add
    for name in planted:
        del sys.modules[name]


@pytest.mark.parametrize(("specs", "message"), [
    (["assistant.api.assistant:component"], "the assistant service needs the llm service, which no loaded component builds"),
    (["collab.api.history:component"], "the history component needs the collab service, which no loaded component builds"),
])
def test_a_missing_dependency_is_an_error_at_start_up(tmp_path, specs, message):
    with pytest.raises(RuntimeError) as error:
        create_app(Settings(data_dir=tmp_path, log_level="warning"), component_specs=["ide_server.api.health:component", *specs])
    assert str(error.value) == message


def test_a_misnamed_need_or_a_service_built_twice_is_an_error_at_start_up(tmp_path, plant):
    misnamed = plant("codeyard_test_misnamed", Component(name="misnamed", needs=("room",)))
    with pytest.raises(RuntimeError, match="the misnamed component needs 'room', which is no service"):
        create_app(Settings(data_dir=tmp_path, log_level="warning"), component_specs=[misnamed])
    twice = plant("codeyard_test_twice", Component(name="second", builds=Builders(checker=lambda core, *, runs: None)))
    with pytest.raises(RuntimeError, match="both the tutorials and the second components build checker"):
        create_app(Settings(data_dir=tmp_path, log_level="warning"), component_specs=["tutorials.api:component", twice])
