"""The composition root: the services the components share, built in dependency order in one place.

Components contribute routes and app setup; the services behind them are built here while the app
serves, each from the ones before it (constructor arguments, never look-ups by name), and stopped in
reverse order. The order is the dependency order, and this function is the one place that says it:

    events    the project events hub       files and projects API, collab, runs, the events socket
    collab    histories, rooms, checkpoints runs and deploys (open editors), the history API
    secrets   ProjectSecrets                runs (their environment), deploys, the secrets API
    runs      ProjectRuns                   deploys (installer), tutorials (checks), Webviews
    deploys   DeployService, apps edge      the deployments API, the /apps gateway
    checker   tutorials' lesson checks      the lesson API
    llm       the IDE's model (LazyLLM)     /v1, /v2, the assistant
    assistant Assistant                     the assistant API

A component names the builder it contributes (`Component(builds=Builders(runs=open_runs))`): a
function typed by a protocol below, whose keyword arguments are what it is built from. A service
that is not built (its component not loaded, as in tests that load a few) is None to the builders
that can do without it; one that cannot (the assistant without the model), or a component whose
routes need a service nobody builds (`Component(needs=...)`), stops `create_app` with a clear error.
ide_server imports no feature package at run time: the types below are imported for the type
checker only, and the builders come with the components `create_app` loads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import State

from ide_server.settings import Settings

if TYPE_CHECKING:  # types only: ide_server imports no feature package at run time
    from assistant.lazy_llm import LazyLLM
    from assistant.service import Assistant
    from collab.history import AutoCheckpointer, Histories
    from collab.rooms import RoomManager
    from deploy_service.edge import AppsEdge
    from deploy_service.secrets import ProjectSecrets
    from deploy_service.service import DeployService
    from ide_server.events import ProjectEvents
    from sandbox import ProjectRuns
    from tutorials.checking import Checker


@dataclass(frozen=True)
class Core:
    """What every builder may use: the settings and the database."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]


class Collab(NamedTuple):
    histories: Histories
    rooms: RoomManager
    checkpoints: AutoCheckpointer


class DeployParts(NamedTuple):
    service: DeployService
    edge: AppsEdge | None  # the apps' own listener (CODEYARD_DEPLOY_APPS_PORT)


class Model(NamedTuple):
    llm: LazyLLM
    grpc_port: int | None  # where KServe v2 gRPC listens (CODEYARD_LLM_GRPC_PORT), None when it does not


class RunSecrets(Protocol):
    """What runs need of the secrets (sandbox sits below deploy_service, which keeps them)."""

    def run_environment_for(self, db: Session, project_id: str) -> dict[str, str]: ...


class BuildsEvents(Protocol):
    def __call__(self, core: Core) -> AbstractAsyncContextManager[ProjectEvents]: ...


class BuildsCollab(Protocol):
    def __call__(self, core: Core, *, events: ProjectEvents | None) -> AbstractAsyncContextManager[Collab]: ...


class BuildsSecrets(Protocol):
    def __call__(self, core: Core) -> ProjectSecrets: ...


class BuildsRuns(Protocol):
    def __call__(self, core: Core, *, events: ProjectEvents | None, collab: Collab | None,
                 secrets: RunSecrets | None) -> AbstractAsyncContextManager[ProjectRuns]: ...


class BuildsDeploys(Protocol):
    def __call__(self, core: Core, *, runs: ProjectRuns | None, collab: Collab | None,
                 secrets: ProjectSecrets | None) -> AbstractAsyncContextManager[DeployParts]: ...


class BuildsChecker(Protocol):
    def __call__(self, core: Core, *, runs: ProjectRuns | None) -> Checker: ...


class BuildsModel(Protocol):
    def __call__(self, core: Core) -> AbstractAsyncContextManager[Model]: ...


class BuildsAssistant(Protocol):
    def __call__(self, core: Core, *, llm: LazyLLM) -> Assistant: ...


@dataclass(frozen=True)
class Builders:
    """The builders a component contributes (most give one), fields in build order."""

    events: BuildsEvents | None = None
    collab: BuildsCollab | None = None
    secrets: BuildsSecrets | None = None
    runs: BuildsRuns | None = None
    deploys: BuildsDeploys | None = None
    checker: BuildsChecker | None = None
    llm: BuildsModel | None = None
    assistant: BuildsAssistant | None = None


# What a builder cannot be built without (the others take None for a service that is not built).
REQUIRED = {"assistant": ("llm",)}


@dataclass
class Services:
    """The built services, read by route dependencies as typed attributes (`services_of(app.state).runs`)."""

    events: ProjectEvents | None = None
    histories: Histories | None = None
    rooms: RoomManager | None = None
    checkpoints: AutoCheckpointer | None = None
    secrets: ProjectSecrets | None = None
    runs: ProjectRuns | None = None
    deploys: DeployService | None = None
    apps_edge: AppsEdge | None = None
    checker: Checker | None = None
    llm: LazyLLM | None = None
    llm_grpc_port: int | None = None
    assistant: Assistant | None = None
    started: list[str] = field(default_factory=list)  # the builders run, in order (for logs and tests)


def merge(contributed: Iterable[tuple[str, Builders]]) -> Builders:
    """One Builders from the components' (name, builders); a service two components build is an error."""
    chosen: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for component, builders in contributed:
        for name in _names():
            if (builder := getattr(builders, name)) is not None:
                if name in chosen:
                    raise RuntimeError(f"both the {owner[name]} and the {component} components build {name}")
                chosen[name], owner[name] = builder, component
    return replace(Builders(), **chosen)


def check(builders: Builders, needs: Iterable[tuple[str, Iterable[str]]]) -> None:
    """At start-up, not at the first request: every builder and component finds what it cannot do without.

    needs: (component name, builder names its routes need)."""
    built = [(f"the {name} service", inputs) for name, inputs in REQUIRED.items() if getattr(builders, name)]
    for who, inputs in [*built, *((f"the {component} component", names) for component, names in needs)]:
        for name in inputs:
            if name not in _names():
                raise RuntimeError(f"{who} needs {name!r}, which is no service (they are: {', '.join(_names())})")
            if getattr(builders, name) is None:
                raise RuntimeError(f"{who} needs the {name} service, which no loaded component builds")


def _names() -> list[str]:
    return [f.name for f in fields(Builders)]


@asynccontextmanager
async def open_services(core: Core, builders: Builders, services: Services) -> AsyncIterator[Services]:
    """Build and start the services in dependency order into `services`; stop them in reverse order."""
    started = services.started
    started.clear()
    async with AsyncExitStack() as stack:
        if builders.events:
            services.events = await stack.enter_async_context(builders.events(core))
            started.append("events")
        collab = None
        if builders.collab:
            collab = await stack.enter_async_context(builders.collab(core, events=services.events))
            services.histories, services.rooms, services.checkpoints = collab
            started.append("collab")
        if builders.secrets:
            services.secrets = builders.secrets(core)
            started.append("secrets")
        if builders.runs:
            services.runs = await stack.enter_async_context(
                builders.runs(core, events=services.events, collab=collab, secrets=services.secrets))
            started.append("runs")
        if builders.deploys:
            services.deploys, services.apps_edge = await stack.enter_async_context(
                builders.deploys(core, runs=services.runs, collab=collab, secrets=services.secrets))
            started.append("deploys")
        if builders.checker:
            services.checker = builders.checker(core, runs=services.runs)
            started.append("checker")
        if builders.llm:
            services.llm, services.llm_grpc_port = await stack.enter_async_context(builders.llm(core))
            started.append("llm")
        if builders.assistant:
            assert services.llm is not None  # check() made sure
            services.assistant = builders.assistant(core, llm=services.llm)
            started.append("assistant")
        yield services


def services_of(state: State) -> Services:
    """The services of the app whose `state` this is."""
    services: Services = state.services
    return services


T = TypeVar("T")


def required(service: T | None, component: str) -> T:
    """A service a route cannot work without (create_app checked that its component is loaded)."""
    if service is None:
        raise RuntimeError(f"the {component} component is not loaded")
    return service
