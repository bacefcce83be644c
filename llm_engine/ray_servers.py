"""Whole servers on a Ray cluster: data-parallel replicas and disaggregated prefill/decode instances
(`codeyard llm serve --distributed-executor ray` with `--data-parallel-size N` or `--disaggregated`).

Each server is `codeyard llm serve` run in a thread of a Ray actor's process, listening on its
node's address with a key only the router (or proxy) knows. So a server lives and dies with its
actor: `ray.kill`, a lost node or the router's exit (Ray ends the actors a driver owns) take it
down and leave nothing behind, which a child process of the actor would not promise. The actors
sit in one placement group of a one-CPU bundle each under `ray_placement_strategy`, as the TP
ranks do (STRICT_SPREAD: one per node). The router and the proxy in front are the local ones,
unchanged: they see URLs only. Instances of disaggregated serving on different nodes pull the KV
over the socket transport (shm needs one host); the transfer itself is unchanged. Like the ranks,
this joins the cluster at RAY_ADDRESS and never starts one; every node needs this package and the
model at the same path. What a server runs is passed in (`Serve`: the CLI's `serve_in_process`),
so this module, below the CLI, never imports it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from llm_engine.entrypoints.disagg_servers import NAMES, role_args
from llm_engine.entrypoints.replicas import Servers, Supervisor, replica_names, wait_healthy
from llm_engine.kv_pool_files import sweep_dead_pools
from llm_engine.ray_executor import PLACEMENT_TIMEOUT_S, connect

Serve = Callable[[list[str]], None]  # runs `codeyard llm serve <args>` in the calling thread until it stops


@dataclass(frozen=True)
class Place:
    """Where a server actor runs: its Ray node, that node's address, its pid, and two ports that
    were free there (HTTP, and the KV port a prefill instance serves)."""

    node_id: str
    ip: str
    pid: int
    port: int
    kv_port: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerActor:
    """`codeyard llm serve <args>` inside this actor's process, in a thread of its own."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def place(self) -> Place:
        return Place(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                     _free_port(), _free_port())

    def serve(self, serve: Serve, args: list[str]) -> None:
        def run() -> None:
            try:
                serve(args)
                self.error = "stopped"
            except BaseException as exc:  # noqa: BLE001 - whatever ended the server is what the launcher reports
                self.error = f"failed: {type(exc).__name__}: {exc}"

        self.thread = threading.Thread(target=run, name="codeyard-serve", daemon=True)
        self.thread.start()

    def failure(self) -> str | None:
        """None while the server runs, else how it ended."""
        return self.error


@dataclass
class RayServers(Servers):
    """Servers running in Ray actors: `places` says where each runs."""

    actors: list[Any]  # ray.actor.ActorHandle of ServerActor
    places: list[Place]


class ServerGroup:
    """Server actors placed on the cluster (`cpus` each: a bundle of that many CPUs and as many
    torch threads); `serve` starts them and starts again any that dies while they serve (the
    local launchers' `Supervisor`), `stop` ends them."""

    def __init__(self, names: list[str], strategy: str, cpus: int = 1) -> None:
        connect()
        self.names, self.cpus = names, cpus
        self.actors: list[Any] = []  # ray.actor.ActorHandle of ServerActor
        self.places: list[Place] = []
        self.commands: list[list[str]] = []  # each server's arguments, for a restart
        self.serve_fn: Serve | None = None
        self.supervisor: Supervisor | None = None
        self.placement: PlacementGroup | None = placement_group([{"CPU": cpus}] * len(names), strategy=strategy)
        ready, _ = ray.wait([self.placement.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            self.stop()
            raise RuntimeError(f"the Ray cluster cannot place {len(names)} servers of {cpus} CPU each with strategy "
                               f"{strategy} within {PLACEMENT_TIMEOUT_S} s (free now: {ray.available_resources()})")
        self.actors = [self._new_actor(i) for i in range(len(names))]
        self.places = ray.get([actor.place.remote() for actor in self.actors])

    def _new_actor(self, index: int) -> Any:  # ray.actor.ActorHandle of ServerActor
        assert self.placement is not None
        return ray.remote(ServerActor).options(
            num_cpus=self.cpus, max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=index)).remote()

    def serve(self, serve: Serve, arg_lists: list[list[str]], ready_timeout_s: float) -> RayServers:
        """Start `codeyard llm serve <args>` in each actor on its node's address with `--num-threads`
        its CPUs (Ray sets OMP_NUM_THREADS to them, but say it); returns once all answer /health."""
        key = secrets.token_urlsafe(24)
        self.serve_fn = serve
        self.commands = [[*args, "--num-threads", str(self.cpus), "--host", place.ip, "--port", str(place.port),
                          "--api-key", key] for place, args in zip(self.places, arg_lists)]
        ray.get([actor.serve.remote(serve, command) for actor, command in zip(self.actors, self.commands)])
        urls = [f"http://{place.ip}:{place.port}" for place in self.places]
        wait_healthy(self.names, urls, self._ended, ready_timeout_s)
        self.supervisor = Supervisor(self.names, self._ended, self._restart)
        self.supervisor.start()
        return RayServers(urls, key, self.actors, self.places)

    def _ended(self, index: int) -> str | None:
        place = self.places[index]
        try:
            failure: str | None = ray.get(self.actors[index].failure.remote(), timeout=PLACEMENT_TIMEOUT_S)
        except RayError as exc:
            kind = "died" if isinstance(exc, RayActorError) else "failed"
            return f"{kind} (Ray actor, pid {place.pid} on node {place.ip}): {str(exc).splitlines()[0]}"
        return failure

    def _restart(self, index: int) -> None:
        """A new actor in the dead one's bundle, serving with its arguments on its port: the router
        or proxy finds it at the same URL. A bundle Ray moved to another node (its node was lost)
        would serve at another address, which the router does not know: not started there."""
        ray.kill(self.actors[index], no_restart=True)  # a server thread that ended leaves its actor alive
        actor = self._new_actor(index)
        self.actors[index] = actor  # before anything can fail: the supervisor then sees this one end
        place = ray.get(actor.place.remote(), timeout=PLACEMENT_TIMEOUT_S)
        old = self.places[index]
        if place.ip != old.ip:
            ray.kill(actor, no_restart=True)
            raise RuntimeError(f"{self.names[index]}'s bundle moved to node {place.ip}; it served at {old.ip}")
        self.places[index] = Place(place.node_id, place.ip, place.pid, old.port, old.kv_port)
        assert self.serve_fn is not None
        ray.get(actor.serve.remote(self.serve_fn, self.commands[index]))

    def stop(self) -> None:
        """Kill the actors and free their bundles. `ray.kill` skips a server's own cleanup, so a
        prefill instance's KV pool file stays in /dev/shm: once the actors on this host are gone,
        the sweep removes it (on other hosts the next producer started there does)."""
        if self.supervisor is not None:
            self.supervisor.stop()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        here = ray.util.get_node_ip_address() if self.actors else None
        _wait_ended([place.pid for place in self.places if place.ip == here])
        sweep_dead_pools()
        self.actors = []
        if self.placement is not None:
            remove_placement_group(self.placement)
            self.placement = None


def _wait_ended(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until these processes of this host have ended (`ray.kill` returns before they do)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):  # gone (the pid may be another user's now)
                break
            time.sleep(0.05)


@contextlib.contextmanager
def server_group(names: list[str], strategy: str, cpus: int = 1) -> Iterator[ServerGroup]:
    group = ServerGroup(names, strategy, cpus)
    try:
        yield group
    finally:
        group.stop()


@contextlib.contextmanager
def ray_replica_servers(serve: Serve, serve_args: list[str], count: int, strategy: str,
                        ready_timeout_s: float = 900, cpus: int = 1) -> Iterator[tuple[list[str], str]]:
    """`replica_servers` on Ray, `cpus` each: yields (the replicas' URLs, their key) once all answer /health."""
    with server_group(replica_names(count), strategy, cpus) as group:
        servers = group.serve(serve, [serve_args] * count, ready_timeout_s)
        yield servers.urls, servers.key


@contextlib.contextmanager
def ray_disaggregated_servers(serve: Serve, serve_args: list[str], kv_transport: str, strategy: str,
                              ready_timeout_s: float = 900, cpus: int = 1) -> Iterator[RayServers]:
    """`disaggregated_servers` on Ray, `cpus` each (urls: prefill, decode); instances on different
    nodes pull the KV over a socket."""
    with server_group(NAMES, strategy, cpus) as group:
        prefill, decode = group.places
        transport = kv_transport if prefill.node_id == decode.node_id else "socket"
        yield group.serve(serve, role_args(serve_args, prefill.ip, prefill.kv_port, transport), ready_timeout_s)
