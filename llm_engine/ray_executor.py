"""Tensor-parallel ranks on a Ray cluster (`distributed_executor_backend="ray"`, vLLM's name).

Each rank is a Ray actor running the same `RankWorker` as a local worker process, and the engine
sends it each step as an actor call. The actors live in one placement group of a one-CPU bundle
per rank, so Ray decides the nodes: `ray_placement_strategy` PACK (the default) fills a node
first, STRICT_SPREAD puts every rank on a different node. The ranks' gloo group meets at a free
port on rank 0's node. The engine joins the cluster at RAY_ADDRESS (Ray's own variable; without
it, the cluster `ray start` left on this machine) and never starts one: serving on one machine
needs no Ray, and this module is imported only when Ray is chosen. Every node needs this package
installed and the model at the same path.

Failure is the local executor's: a rank that dies (its actor, process or node) or fails takes the
group with it; the executor kills the other actors, frees the placement group and raises
`WorkerGroupError`, and the engine fails the requests whose KV lived there and calls `restart`.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, NoReturn

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from llm_engine.config import EngineConfig
from llm_engine.executor import WorkerGroupError, WorkerGroupExecutor
from llm_engine.kv_connector import KVShardFile
from llm_engine.model_runner import StepInput
from llm_engine.worker import RankWorker, StepResult

PLACEMENT_TIMEOUT_S = 60  # a cluster without room for the group says so instead of waiting for nodes forever
FAILURE_GRACE_S = 2.0  # after a first error, how long the other ranks get to report a death (the likelier cause)
CLOSE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0


class RankActor:
    """One rank inside a Ray actor: where it runs, then the RankWorker's load and steps."""

    def __init__(self) -> None:
        self.worker: RankWorker | None = None

    def place(self) -> tuple[str, str, int, int]:
        """(node id, node IP, pid, a free port on this node for the group's rendezvous)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port: int = sock.getsockname()[1]
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid(), port

    def load(self, rank: int, world_size: int, init_method: str, config: EngineConfig
             ) -> tuple[int, KVShardFile | None]:
        self.worker = RankWorker(rank, world_size, init_method, config)
        return self.worker.ready()

    def step(self, step: StepInput) -> StepResult:
        assert self.worker is not None, "step before load"
        return self.worker.step(step)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def connect() -> None:
    """Join the Ray cluster at RAY_ADDRESS (once per process); no cluster is a clear error."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        if ":" in address and "://" not in address:  # host:port of the head's GCS: ray.init retries it for minutes
            host, port = address.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
        ray.init(address=address, logging_level=logging.WARNING)
    except (OSError, ValueError, RayError) as exc:  # ConnectionError is an OSError
        raise WorkerGroupError(f"distributed_executor_backend 'ray': no Ray cluster reachable at "
                               f"RAY_ADDRESS={address} (start one with `ray start --head`): {exc}") from exc


class RayExecutor(WorkerGroupExecutor):
    """The ranks as Ray actors in a placement group; `nodes` says where each rank runs."""

    def __init__(self, config: EngineConfig) -> None:
        self.actors: list[Any] = []  # ray.actor.ActorHandle of RankActor, one per rank
        self.placement: PlacementGroup | None = None
        self.nodes: list[str] = []  # Ray node id of each rank
        self._places: list[tuple[str, str, int, int]] = []
        connect()
        super().__init__(config)

    @property
    def pids(self) -> list[int]:
        return [place[2] for place in self._places]

    def _start(self) -> int:
        world_size = self.config.tensor_parallel_size
        strategy = self.config.ray_placement_strategy
        self.placement = placement_group([{"CPU": 1}] * world_size, strategy=strategy)
        ready, _ = ray.wait([self.placement.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            self._fail(f"the Ray cluster cannot place {world_size} ranks of one CPU each with strategy "
                       f"{strategy} within {PLACEMENT_TIMEOUT_S} s (free now: {ray.available_resources()})")
        actor_class = ray.remote(RankActor)
        self.actors = [actor_class.options(
            num_cpus=1, max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=rank)).remote() for rank in range(world_size)]
        self._places = self._gather([actor.place.remote() for actor in self.actors])
        self.nodes = [place[0] for place in self._places]
        init_method = f"tcp://{self._places[0][1]}:{self._places[0][3]}"
        return self._pool_size(lambda: self._gather([actor.load.remote(rank, world_size, init_method, self.config)
                                                     for rank, actor in enumerate(self.actors)]))

    def _run(self, step: StepInput) -> StepResult:
        if not self.actors:
            raise WorkerGroupError("the tensor-parallel workers are stopped")
        step_ref = ray.put(step)  # stored once, read by every rank
        result: StepResult = self._gather([actor.step.remote(step_ref) for actor in self.actors])[0]
        return result

    def _gather(self, refs: list[Any]) -> list[Any]:
        """Each rank's result, in rank order; a rank that died or failed fails the group."""
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except RayError as exc:
                self._fail(*self._cause(refs, refs.index(ready[0]), exc))
        return list(ray.get(refs))

    def _cause(self, refs: list[Any], rank: int, error: RayError) -> tuple[str, Exception | None]:
        """What failed the group: a rank that died, when one did (the others then fail in their
        collectives, and may report that first), else the first error."""
        ray.wait(refs, num_returns=len(refs), timeout=FAILURE_GRACE_S)
        for other, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=0)
            except RayActorError as exc:
                return self._describe(other, exc), None
            except (RayError, GetTimeoutError):
                continue
        return self._describe(rank, error), error.cause if isinstance(error, RayTaskError) else None

    def _describe(self, rank: int, error: RayError) -> str:
        where = (f" (Ray actor, pid {self._places[rank][2]} on node {self._places[rank][1]})"
                 if rank < len(self._places) else "")
        if isinstance(error, RayActorError):
            return f"tensor-parallel rank {rank}{where} died: {str(error).splitlines()[0]}"
        cause = error.cause if isinstance(error, RayTaskError) else error
        return f"tensor-parallel rank {rank}{where} failed: {type(cause).__name__}: {cause}"

    def _fail(self, message: str, cause: Exception | None = None) -> NoReturn:
        self._stop(graceful=False)
        raise WorkerGroupError(message) from cause

    def _stop(self, graceful: bool) -> None:
        if graceful and self.actors:
            try:
                ray.get([actor.close.remote() for actor in self.actors], timeout=CLOSE_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                pass  # killed below either way
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        self._places = []
        if self.placement is not None:
            remove_placement_group(self.placement)
            self.placement = None
