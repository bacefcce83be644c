"""Liveness and readiness probes (outside /api: for load balancers, not users)."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from ide_server import db
from ide_server.components import Component
from ide_server.deps import Public

router = APIRouter(tags=["health"], dependencies=[Public])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Database unreachable or not migrated"}})
def readyz(request: Request) -> JSONResponse:
    """The database answers and its schema is at the newest migration."""
    engine = request.app.state.engine
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current, head = db.current_revision(engine), db.head_revision()
    except Exception as exc:  # any failure to reach the database means "not ready"
        return JSONResponse({"status": "unavailable", "detail": f"database: {type(exc).__name__}"}, status_code=503)
    if current != head:
        return JSONResponse(
            {"status": "unavailable", "detail": f"database schema at {current}, expected {head}"}, status_code=503
        )
    return JSONResponse({"status": "ok", "database": engine.dialect.name, "schema": current})


component = Component(name="health", router=router)
