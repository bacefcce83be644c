"""The services the components share, as typed attributes of one object (`app.state.services`).

Each component builds its service in its setup or lifespan and sets it here; the components that
use it read the attribute (None when the component that builds it is not loaded, as in tests that
load a few components). One place to see who provides what, and a typo is a type error, not a
runtime None. Setups all run before any lifespan, so a lifespan may use what any setup built:

    events       ide_server.api.events (setup)       files API, projects API, collab, runs
    histories    collab.api.editing (setup)            history API, checkpoints
    secrets      deploy_service.api.secrets (setup)  runs (their environment), deploys
    rooms        collab.api.editing (lifespan)         runs and deploys (open editors), history API
    checkpoints  collab.api.editing (lifespan)         runs and deploys (checkpoint before a run)
    runs         sandbox.api (lifespan)        deploys (installer), tutorials (checks), previews
    deploys      deploy_service.api.deployments (lifespan) the /apps gateway
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from starlette.datastructures import State

if TYPE_CHECKING:  # types only: ide_server imports no feature package at run time
    from collab.history import AutoCheckpointer, Histories
    from collab.rooms import RoomManager
    from deploy_service.secrets import ProjectSecrets
    from deploy_service.service import DeployService
    from ide_server.events import ProjectEvents
    from sandbox import ProjectRuns


@dataclass
class Services:
    events: ProjectEvents | None = None
    histories: Histories | None = None
    secrets: ProjectSecrets | None = None
    rooms: RoomManager | None = None
    checkpoints: AutoCheckpointer | None = None
    runs: ProjectRuns | None = None
    deploys: DeployService | None = None


def services_of(state: State) -> Services:
    """The services of the app whose `state` this is."""
    services: Services = state.services
    return services


T = TypeVar("T")


def required(service: T | None, component: str) -> T:
    """A service a route cannot work without (its component is loaded whenever the route is)."""
    if service is None:
        raise RuntimeError(f"the {component} component is not loaded")
    return service
