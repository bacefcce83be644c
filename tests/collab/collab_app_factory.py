"""The real ide_server app with the collab component added (until the lead wires it into COMPONENTS).

Run: CODEYARD_DATA_DIR=... CODEYARD_DATABASE_URL=... uvicorn --app-dir tests/collab
collab_app_factory:create --factory
"""

from fastapi import FastAPI

from collab.store import CollabBase
from ide_server.app import create_app
from ide_server.components import COMPONENTS
from ide_server.settings import Settings


def create() -> FastAPI:
    app = create_app(Settings(), component_specs=[*COMPONENTS[:-1], "collab.component:component", COMPONENTS[-1]])
    CollabBase.metadata.create_all(app.state.engine)  # until the tables are in the Alembic migrations
    return app
