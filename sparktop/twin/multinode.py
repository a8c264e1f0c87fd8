"""How a TwinServer spans nodes under tensor parallelism.

The head either connects to a running Ray cluster and places its workers
there, or opens a torch.distributed-style rendezvous and waits for
`--headless` workers to join; a headless worker joins its head and then only
follows it. Either way the loss of a peer is fatal, as NCCL makes it in vLLM.
`MultiNode` is a mixin for TwinServer: it works on the server's own state
(args, host, log, stage, engine, tasks) and reports a lost peer through
`_fail`.

While it serves, the head tells every node the bytes its all-reduces have
sent over the link (tokens computed x `PerfModel.link_bytes_per_token`),
and each node moves its own ports' counters by them where its NCCL would
put them (`link.LinkTraffic`: RDMA on both halves of the cable, or TCP
with `NCCL_IB_DISABLE=1`, as the node's environment says).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING

from sparktop.twin.link import LinkTraffic, Route
from sparktop.twin.rendezvous import HeadRendezvous, join
from sparktop.twin.startup import StartupError, StartupPlan

if TYPE_CHECKING:
    from sparktop.twin.args import ServeArgs
    from sparktop.twin.dialects.base import TwinLog
    from sparktop.twin.engine import Engine
    from sparktop.twin.host import TwinHost
    from sparktop.twin.ray import RayDriver

HEAD_WAIT_SECONDS = 600.0  # torch.distributed's store timeout, in modeled time
# The store timeout is what the head and its workers wait for each other. Sped up with start-up, it would be
# 2 s at the lab's 300x: less than another twin process takes to start on a busy machine (its Python and
# its imports are real time, which no speed-up shortens), so a launch would fail on the machine's pace.
PROCESS_START_S = 30.0


def store_wait(startup_speed: float) -> float:
    """Seconds the head waits for its workers and a worker for its head: the store timeout at the twin's
    start-up speed, but never less than a process takes to start here."""
    return max(HEAD_WAIT_SECONDS / startup_speed, PROCESS_START_S)
LINK_EVERY_S = 0.5  # how often the link counters move (on the head and, told by it, on the other nodes)


def worker_process_name(rank: int, tp: int, pp: int) -> str:
    """vLLM's name for a worker process: `VLLM::Worker_TP1`, or with
    pipeline stages `VLLM::Worker_PP1_TP0` (stage, then rank within it)."""
    if pp == 1:
        return f"VLLM::Worker_TP{rank}"
    return f"VLLM::Worker_PP{rank // tp}_TP{rank % tp}"


class MultiNode:
    """Distributed start-up for the head and for headless workers."""

    # The server's state this mixin works on (TwinServer.__init__ sets it).
    args: ServeArgs
    log: TwinLog
    host: TwinHost | None
    engine: Engine | None
    startup_speed: float
    stage: str
    ready: asyncio.Event
    _tasks: list[asyncio.Task]
    _rdv: HeadRendezvous | None
    _ray: RayDriver | None
    _registered: bool

    if TYPE_CHECKING:
        def _fail(self, message: str) -> None: ...

    async def _start_distributed(self, plan: StartupPlan) -> None:
        args, log = self.args, self.log
        world = args.world_size  # one GPU per node: every rank is a node
        used_mib = int(args.gpu_memory_utilization * plan.perf.hw.memory_gib * 1024)
        if args.ray:
            from sparktop.twin.ray import RayDriver, head_address

            address = head_address(self.host)
            if not address:
                raise StartupError(
                    "ValueError: The number of required GPUs exceeds the total number of available GPUs in "
                    f"the placement group. Required: {world}, available: 1 (no Ray cluster is running; start "
                    "one with `ray start --head` and `ray start --address`)"
                )
            log.info("ray_utils.py:357", f"Connecting to existing Ray cluster at address: {address}")
            driver = RayDriver(address, f"{self.host.name if self.host else 'twin'}-{os.getpid()}")
            try:
                workers = await driver.connect(world, used_mib)
            except (TimeoutError, OSError) as exc:
                raise StartupError(
                    f"ConnectionError: could not connect to the Ray cluster at {address}: {exc}") from exc
            except RuntimeError as exc:
                raise StartupError(f"ValueError: {exc}") from exc
            self._ray = driver
            log.info("ray_distributed_executor.py:180",
                     f"RayWorkerWrapper placed on: {', '.join(workers) or 'this node'}")
            self._tasks.append(asyncio.create_task(self._watch_ray(driver)))
            self._tasks.append(asyncio.create_task(self._link_loop()))
            return
        if args.nnodes < 2:
            raise StartupError(
                f"ValueError: world_size ({world}) is larger than the number of available GPUs (1) on this node; "
                "use --nnodes/--node-rank for multi-node tensor parallelism or the Ray executor"
            )
        if args.nnodes != world:
            # One GPU per Spark: the ranks are the nodes.
            raise StartupError(
                f"ValueError: world_size ({world} = tensor_parallel_size {args.tensor_parallel_size} x "
                f"pipeline_parallel_size {args.pipeline_parallel_size}) must equal nnodes ({args.nnodes}) x "
                "the GPUs per node (1)"
            )
        init = f"tcp://{args.master_addr}:{args.master_port}"
        log.engine("parallel_state.py:1402",
                   f"world_size={world} rank=0 local_rank=0 distributed_init_method={init} backend=nccl")
        self._rdv = HeadRendezvous(args.master_addr, args.master_port, args.nnodes, args.model,
                                   on_lost=self._peer_lost)
        try:
            await self._rdv.start()
        except OSError as exc:
            raise StartupError(f"torch.distributed.DistNetworkError: failed to bind {init}: {exc.strerror}") from exc
        log.engine("parallel_state.py:1410", f"Waiting for {args.nnodes - 1} more node(s) to join at {init}")
        self.stage = "waiting for workers"
        wait = args.store_wait or store_wait(self.startup_speed)
        try:
            await self._rdv.wait(wait, {"used_mib": used_mib})
        except TimeoutError:
            # The timeout carries nothing more than this message says.
            raise StartupError(
                f"torch.distributed.DistStoreError: Timed out after {HEAD_WAIT_SECONDS:.0f} seconds waiting "
                f"for clients. 1/{args.nnodes} clients joined."
            ) from None
        hosts = ", ".join(p.host for p in self._rdv.peers)
        log.engine("parallel_state.py:1715", f"all {args.nnodes} nodes joined (workers on {hosts})")
        self._tasks.append(asyncio.create_task(self._link_loop()))

    def _nccl_info(self, route: Route) -> None:
        """What NCCL says about its transport, with NCCL_DEBUG=INFO (and only then, as NCCL)."""
        if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
            return
        where = f"{self.host.name if self.host else socket.gethostname()}:{os.getpid()}:{os.getpid()} [0]"
        for line in route.said:
            self.log.raw(f"{where} NCCL INFO {line}")

    async def _link_loop(self) -> None:
        """The head's part in the link: once the engine runs, every LINK_EVERY_S, the bytes each node has
        sent so far move this host's counters and go to the other nodes, which move theirs."""
        while self.engine is None:
            await asyncio.sleep(0.05)
        engine = self.engine
        per_token = engine.perf.link_bytes_per_token()
        traffic = LinkTraffic(self.host.home) if self.host else None
        if traffic is not None:
            self._nccl_info(traffic.route)
        try:
            while True:
                total = engine.tokens_computed * per_token
                if traffic is not None:
                    traffic.advance(total)
                if self._rdv:
                    await self._rdv.broadcast({"link": total})
                if self._ray:
                    await self._ray.link(total)
                await asyncio.sleep(LINK_EVERY_S)
        finally:
            if traffic is not None:  # the last steps' bytes, as the engine stops
                traffic.advance(engine.tokens_computed * per_token)

    def _peer_lost(self, reason: str) -> None:
        self.log.error("multiproc_executor.py:151",
                       f"Worker proc died unexpectedly ({reason}); NCCL communicator was aborted, shutting down.")
        if self.engine:
            self.engine.fail(f"EngineCore encountered a fatal error: {reason}")
        self._fail(reason)

    async def _watch_ray(self, driver) -> None:
        reason = await driver.watch()
        self.log.error("ray_distributed_executor.py:480",
                       f"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task "
                       f"({reason}).")
        if self.engine:
            self.engine.fail(f"EngineCore encountered a fatal error: {reason}")
        self._fail(reason)

    async def _run_headless(self) -> None:
        args, log = self.args, self.log
        rank = args.node_rank
        log.info("api_server.py:1931", f"Launching headless worker rank {rank} (nnodes={args.nnodes}) "
                                       f"for {args.model}; master tcp://{args.master_addr}:{args.master_port}")
        wait = args.store_wait or store_wait(self.startup_speed)
        try:
            reader, writer, reply = await join(args.master_addr, args.master_port, {
                "rank": rank, "model": args.model, "host": self.host.name if self.host else socket.gethostname(),
            }, wait)
        except TimeoutError as exc:
            raise StartupError(f"torch.distributed.DistNetworkError: {exc}") from exc
        except RuntimeError as exc:
            raise StartupError(f"RuntimeError: {exc}") from exc
        self._peer_writer = writer  # keep the connection open while we serve
        used = int(reply.get("used_mib", 0))
        if self.host:
            self.host.register(os.getpid(), worker_process_name(rank, args.tensor_parallel_size,
                                                                args.pipeline_parallel_size), used)
            self._registered = True
        log.engine("parallel_state.py:1715", f"rank {rank} joined the head; serving as a headless worker")
        self.stage = "ready"
        self.ready.set()

        traffic = LinkTraffic(self.host.home) if self.host else None
        if traffic is not None:
            self._nccl_info(traffic.route)

        async def follow():
            from sparktop.twin import wire

            while True:
                msg = await wire.recv(reader)
                if msg is None:
                    break
                if self.host and "util" in msg:
                    self.host.update_util(os.getpid(), float(msg["util"]))
                if traffic is not None and "link" in msg:
                    traffic.advance(float(msg["link"]))
            log.error("multiproc_executor.py:151",
                      "RuntimeError: NCCL communicator was aborted: the head node went away.")
            self._fail("the head node went away")

        self._tasks.append(asyncio.create_task(follow()))
