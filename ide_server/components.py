"""Components: how features plug into the app (in the spirit of Datasette plugins).

A component is a router plus optional setup and lifespan hooks, and the builder of the service
behind its routes. The core features (health, accounts, projects, files, web pages) are components
too, so later features (collaboration, sandbox runs, deploys, tutorials, the LLM's /v1 API) plug in
the same way:

1. In your package's route module (`<package>/api.py`, or `<package>/api/<area>.py`), build a
   `Component`, e.g. in `collab/api/editing.py`:

       router = APIRouter()

       @router.websocket("/ws/collab/{project_id}/{file_path:path}")
       async def collab_socket(websocket: WebSocket, project_id: str, file_path: str): ...

       component = Component(name="collab", router=router, builds=Builders(collab=open_collab))

   A shared service is built by `ide_server.wiring.open_services`, in dependency order, from the
   builders the loaded components give (a new shared service adds its field and protocol there).
2. Append "collab.api.editing:component" to `COMPONENTS` below. The list's order is the order of
   the routes (the browser pages own "/" last), never the order services start in.

Every route under /api, and every route in the OpenAPI document, must declare an access rule
through the dependencies of `ide_server.deps` (`Public`, `CurrentUser`, `ProjectViewer`,
`ProjectMember`, `ProjectEditor`, `ProjectOwner`), or `create_app` refuses to start. Components are imported when the app is created, not when the
CLI starts, so heavy imports in them don't slow down `codeyard --help`.
"""

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from importlib import import_module

from fastapi import APIRouter, FastAPI

from ide_server.wiring import Builders


@dataclass(frozen=True)
class Component:
    """name: for logs and errors. router: included into the app as it is (give it its prefix).
    setup: called with the app after the router is included (mounts, middleware, error handlers).
    builds: the builder of the shared service it provides (see `ide_server.wiring`).
    needs: the services its routes cannot work without (names of `Builders` fields), checked at start-up.
    lifespan: an async context manager factory run while the app serves, after the shared services
    started (a plugin's own clients)."""

    name: str
    router: APIRouter | None = None
    setup: Callable[[FastAPI], None] | None = None
    builds: Builders = field(default_factory=Builders)
    needs: tuple[str, ...] = ()
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None


COMPONENTS: list[str] = [
    "ide_server.api.health:component",
    "ide_server.api.accounts:component",
    "ide_server.api.projects:component",
    "ide_server.api.files:component",
    "assistant.api.llm:component",
    "assistant.api.assistant:component",
    "collab.api.editing:component",
    "ide_server.api.events:component",
    "collab.api.history:component",
    "sandbox.api:component",
    "deploy_service.api.secrets:component",
    "deploy_service.api.deployments:component",
    "tutorials.api:component",
    "ide_server.api.pages:component",  # browser pages last: they own "/" and "/static"
]


def load(spec: str) -> Component:
    """Import "module:attribute" and check that it is a Component."""
    module_name, _, attr = spec.partition(":")
    component = getattr(import_module(module_name), attr or "component")
    if not isinstance(component, Component):
        raise TypeError(f"{spec} is a {type(component).__name__}, not a Component")
    return component


def load_all(specs: list[str] | None = None) -> list[Component]:
    return [load(spec) for spec in (COMPONENTS if specs is None else specs)]
