"""Access rules: every `/api` route declares who may call it, through the dependencies it uses.

A rule rides on the dependency that enforces it (`deps.CurrentUser`, `deps.ProjectEditor`,
`deps.Public`...), so declaration and enforcement cannot drift apart. `route_rule` reads a
route's rule back from its dependency tree; `create_app` refuses to start when an `/api`
route has none, and the access-control test calls every route against its rule.
"""

from dataclasses import dataclass

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute

from ide_server.models import Role

API_PREFIX = "/api"


@dataclass(frozen=True)
class AccessRule:
    """signed_in: anonymous callers get 401. project_role: the caller needs at least this role on
    the `{project_id}` in the path. public_read: a public project satisfies a viewer rule."""

    signed_in: bool
    project_role: Role | None = None
    public_read: bool = False

    def combine(self, other: "AccessRule") -> "AccessRule":
        """The rule of a route that uses both dependencies: the stricter of each part."""
        roles = [r for r in (self.project_role, other.project_role) if r is not None]
        public_read = all(r.public_read for r in (self, other) if r.project_role is not None)
        return AccessRule(
            signed_in=self.signed_in or other.signed_in,
            project_role=max(roles, key=lambda r: r.rank) if roles else None,
            public_read=public_read and bool(roles),
        )


PUBLIC = AccessRule(signed_in=False)
SIGNED_IN = AccessRule(signed_in=True)


def project_rule(min_role: Role, public_read: bool = False) -> AccessRule:
    return AccessRule(signed_in=not public_read, project_role=min_role, public_read=public_read)


def route_rule(route: BaseRoute) -> AccessRule | None:
    """The combined rule of all access dependencies of an HTTP or WebSocket route, or None."""
    if not isinstance(route, APIRoute | APIWebSocketRoute):
        return None
    rules = list(_rules(route.dependant))
    if not rules:
        return None
    rule = rules[0]
    for other in rules[1:]:
        rule = rule.combine(other)
    return rule


def _rules(dependant: Dependant):
    for dep in dependant.dependencies:
        rule = getattr(dep.call, "access_rule", None)
        if rule is not None:
            yield rule
        yield from _rules(dep)


def unguarded_api_routes(routes: list[BaseRoute], exempt: set[str]) -> list[str]:
    """Descriptions of `/api` routes that declare no access rule (must be empty).
    `exempt`: paths FastAPI itself serves (the OpenAPI document and its docs page)."""
    missing = []
    for route in routes:
        path = getattr(route, "path", "")
        if path.startswith(API_PREFIX) and path not in exempt and route_rule(route) is None:
            missing.append(f"{','.join(sorted(getattr(route, 'methods', None) or ['WS']))} {path}")
    return missing
