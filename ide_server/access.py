"""Access rules: every API route declares who may call it, through the dependencies it uses.

A rule rides on the dependency that enforces it (`deps.CurrentUser`, `deps.ProjectEditor`,
`deps.Public`...), so declaration and enforcement cannot drift apart. `app_routes` reads each
route's rule back from its dependency tree; `create_app` refuses to start when a guarded route
(anything under /api, and every route in the OpenAPI document, e.g. /v1) has none, and the
access-control test calls every route against its rule.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIWebSocketRoute, iter_route_contexts
from starlette.routing import BaseRoute, WebSocketRoute

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


@dataclass(frozen=True)
class RouteInfo:
    """One route as the app serves it (after router inclusion), with its access rule."""

    path: str  # as declared, e.g. /api/projects/{project_id}/files/content/{path:path}
    path_format: str  # with plain placeholders, for building URLs
    methods: tuple[str, ...]  # ("WS",) for WebSocket routes
    params: tuple[str, ...]
    in_schema: bool  # listed in the OpenAPI document
    rule: AccessRule | None

    @property
    def guarded(self) -> bool:
        """Must declare an access rule: /api routes and every documented route."""
        return self.path.startswith(API_PREFIX) or self.in_schema


def app_routes(routes: list[BaseRoute]) -> list[RouteInfo]:
    """Every route of an app, flattened out of included routers."""
    infos = []
    for ctx in iter_route_contexts(routes):
        original = ctx.original_route
        dependant = getattr(ctx, "dependant", None) or getattr(original, "dependant", None)
        is_ws = isinstance(original, APIWebSocketRoute | WebSocketRoute)
        methods = ("WS",) if is_ws else tuple(sorted((ctx.methods or set()) - {"HEAD"}))
        infos.append(
            RouteInfo(
                path=ctx.path or "",
                path_format=ctx.path_format or ctx.path or "",
                methods=methods,
                params=tuple(getattr(ctx, "param_convertors", {}) or ()),
                in_schema=not is_ws and bool(getattr(ctx, "include_in_schema", False)),
                rule=rule_of(dependant) if dependant is not None else None,
            )
        )
    return infos


def rule_of(dependant: Dependant) -> AccessRule | None:
    """The combined rule of all access dependencies in a dependency tree, or None."""
    rules = list(_rules(dependant))
    if not rules:
        return None
    rule = rules[0]
    for other in rules[1:]:
        rule = rule.combine(other)
    return rule


def _rules(dependant: Dependant) -> Iterator[AccessRule]:
    for dep in dependant.dependencies:
        rule = getattr(dep.call, "access_rule", None)
        if rule is not None:
            yield rule
        yield from _rules(dep)


def guarded_routes(routes: list[BaseRoute], exempt: set[str]) -> list[RouteInfo]:
    """The routes that must declare a rule, less `exempt` paths (the OpenAPI document and docs page)."""
    return [r for r in app_routes(routes) if r.guarded and r.path not in exempt]


def unguarded_routes(routes: list[BaseRoute], exempt: set[str]) -> list[str]:
    """"METHODS path" of every guarded route that declares no access rule (must be empty)."""
    return [f"{','.join(r.methods) or 'ANY'} {r.path}" for r in guarded_routes(routes, exempt) if r.rule is None]
