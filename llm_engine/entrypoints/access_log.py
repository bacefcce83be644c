"""uvicorn's HTTP protocol with each request's access-log line written once its response has ended,
not as its headers go out (`llm serve`'s `http=`).

uvicorn logs the line ('client - "POST /v1/completions HTTP/1.1" 200') inside the send of
`http.response.start`. A stream's headers go out with its first token (the handlers wait for the
first output, so that a refused prompt still gets its status), so the line was written on the first
token's way to the client: traced on an isolated /v1 request (the engine idle for a prefill, the
API process's CPU shared with the client), 133 us of the API process's CPU (median of 16; warm,
~16 us), all before the server waits again and the client on its CPU can read the token. Here the
same line, through the same logger and formatter, is written when the application returns: after a
stream's last event, or a plain response's body. A response uvicorn answers itself (500: the
application failed before starting one) is logged by uvicorn as before.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

ASGIApp = Any  # uvicorn's ASGI3Application


class LateAccessLog(HttpToolsProtocol):
    """HttpToolsProtocol (uvicorn's `http="httptools"`) with the access line at the response's end."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGIApp) -> None:
        if cycle.access_log:
            cycle.access_log = False
            app = _logged_at_end(app, cycle)
        super()._start_asgi_task(cycle, app)


def _logged_at_end(app: ASGIApp, cycle: RequestResponseCycle) -> ASGIApp:
    async def logged(scope: Any, receive: Any, send: Any) -> None:
        status: int | None = None

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            if status is None:
                cycle.access_log = True  # uvicorn answers this one itself (500), and logs it
            else:  # uvicorn's own line (its AccessFormatter reads these arguments)
                cycle.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                         get_path_with_query_string(scope), scope["http_version"], status)

    return logged
