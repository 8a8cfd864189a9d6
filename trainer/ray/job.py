"""``python -m trainer.ray_job [Ray flags] [trainer flags]``: the trainer on a Ray cluster.

Order: connect (or start a local cluster) -> disaggregated only: reserve engine GPUs, start the
engine actors, wait for /health, put sglang-router in front (for other clients), start the engine
supervisor -> reserve trainer GPUs, start one actor per rank, rank 0 picks the rendezvous address
-> every rank runs ``trainer.train.main``. Each phase prints; each wait has a deadline. The first
failure of a rank or the router ends the job with a message naming it; a dead engine does not:
the trainer re-issues its requests to the others and the supervisor replaces it
(``supervisor.py``). The job's end, an error or Ctrl-C kill every actor, and with them the engine
servers and the router.
"""

from __future__ import annotations

import os
import sys
import time

from ..startup import interrupt
from ..launch import phase
from . import cluster, options, placement
from .engines import FAULT_ENV, exit_after, new_engine, wait_healthy
from .options import RayJobError, RayOptions
from .router import RouterProcess, router_available, wait_routing
from .supervisor import ACTOR_NAME, EngineSupervisor, supervisor_env
from .trainer_actor import ENV as TRAINER_ENV
from .trainer_actor import RankResult, TrainerRank

ROUTER_TIMEOUT = 120.0  # seconds for the router to start and register the (healthy) engines


class RayJob:
    def __init__(self, opts: RayOptions, argv: list[str], trainer_args):
        self.opts, self.argv, self.trainer_args = opts, argv, trainer_args
        self.actors: list = []  # every actor of the job: killed at its end
        self.reservations: list = []
        self.watch: dict = {}  # ref of a call that returns only when its actor stops -> its name
        self.engines: list = []  # the first engine actors (the supervisor owns replacements)
        self.engine_urls: list[str] = []
        self.supervisor = None

    # --- the phases ----------------------------------------------------------------------
    def run(self) -> None:
        bundles = self.opts.trainer_gpus + self.opts.num_engines
        with phase("connect to Ray") as info:
            self.cluster = cluster.connect(self.opts, bundles)
            info["detail"] = self.cluster.describe()
        cluster.check_capacity(self.cluster, self.opts)
        extra = [] if self.opts.colocate else self._start_rollout()
        self._train(extra)
        self._report()

    def _start_rollout(self) -> list[str]:
        """Engines, the router and the engine supervisor: the trainer flags that point the
        trainer at the engines. The trainer talks to the engines itself, not through the router:
        behind one router URL it could not tell which engine died, re-issue that engine's
        requests elsewhere (same index and seed) or ask for its restart."""
        from ..rollout.engines.config import server_args_from

        n = self.opts.num_engines
        reservation = self._reserve("rollout engines", n, "PACK")
        server_args = server_args_from(self.trainer_args)  # the --sglang-* flags, device auto
        with phase(f"start {n} rollout engine(s) (sglang-kvc HTTP servers)") as info:
            self.engine_urls = self._start_engines(reservation, server_args)
            info["detail"] = ", ".join(self.engine_urls)
        router = self._start_router()
        self._start_supervisor(reservation, server_args, router)
        # engines on their own GPUs: weights go over a process group (NCCL; gloo on a CPU)
        # unless the user chose a transport; rank 0's node address is $MASTER_ADDR there
        sync = [] if "--weight-sync" in self.argv else ["--weight-sync", "distributed"]
        return ["--rollout-server-urls", *self.engine_urls, *sync]

    def _start_engines(self, reservation, server_args) -> list[str]:
        drill = os.environ.get(FAULT_ENV)  # a test's engine that kills itself (engines.py)
        self.engines = [new_engine(reservation, i, server_args, exit_after(i, drill))
                        for i in range(len(reservation.order))]
        self.actors.extend(self.engines)
        begin = time.monotonic()
        urls = self._await([e.start.remote() for e in self.engines], "rollout engine",
                           self.opts.engine_start_timeout)
        wait_healthy(urls, max(1.0, self.opts.engine_start_timeout - (time.monotonic() - begin)))
        return urls

    def _start_router(self) -> str | None:
        if not router_available():
            print("[ray] sglang-router is not installed: no router URL for clients besides the "
                  "trainer (which talks to the engines itself)", flush=True)
            return None
        with phase("start sglang-router") as info:
            url = self._router()
            info["detail"] = (f"{url} -> {len(self.engine_urls)} engine(s), round robin, for "
                              f"clients besides the trainer")
        return url

    def _router(self) -> str:
        import ray

        router = ray.remote(RouterProcess).options(num_cpus=0, scheduling_strategy=_this_node()
                                                   ).remote(self.engine_urls)
        self.actors.append(router)
        url = self._await([router.start.remote()], "sglang-router", ROUTER_TIMEOUT)[0]
        self.watch[router.wait.remote()] = f"sglang-router ({url})"
        wait_routing(url, self.engine_urls, ROUTER_TIMEOUT)
        return url

    def _start_supervisor(self, reservation, server_args, router: str | None) -> None:
        """The named actor the trainer asks for a dead engine's replacement (``supervisor.py``)."""
        import ray

        supervisor = ray.remote(EngineSupervisor).options(
            name=ACTOR_NAME, num_cpus=0, max_concurrency=len(self.engines) + 2,
            scheduling_strategy=_this_node()).remote(
            self.engines, self.engine_urls, reservation, server_args, router,
            self.opts.engine_start_timeout)
        self.actors.append(supervisor)
        self._await([supervisor.ready.remote()], "engine supervisor", 60.0)
        self.supervisor = supervisor

    def _train(self, extra: list[str]) -> None:
        n = self.opts.trainer_gpus
        strategy = "STRICT_PACK" if self.opts.actor_num_nodes == 1 else "PACK"
        reservation = self._reserve("trainer ranks", n, strategy)
        with phase(f"start {n} trainer rank actor(s)") as info:
            env = {**cluster.worker_env(), **TRAINER_ENV}
            if self.supervisor is not None:  # rank 0's restart hook finds it by this name
                env.update(supervisor_env(self.opts.engine_start_timeout))
            ranks = [self._actor(TrainerRank, reservation, r, runtime_env={"env_vars": env})
                     .remote(r, n) for r in range(n)]
            master = self._await([ranks[0].master_address.remote()], "trainer rank", 120.0)[0]
            info["detail"] = f"rendezvous at {master[0]}:{master[1]}"
        runs = {rank.run.remote(self.argv + extra, master, os.getcwd()): r
                for r, rank in enumerate(ranks)}
        self._monitor(runs)

    # --- waiting and watching --------------------------------------------------------------
    def _monitor(self, runs: dict) -> None:
        """Until every rank has returned; the first failure of a rank or the router ends the job
        (an engine's does not: the trainer fails over and the supervisor replaces it)."""
        import ray

        pending = dict(runs)
        while pending:
            ready, _ = ray.wait([*pending, *self.watch], num_returns=1, timeout=1.0)
            for ref in ready:
                if ref in self.watch:
                    raise RayJobError(f"{self.watch[ref]} stopped during training: "
                                      f"{_outcome(ref)}{self._resume_hint()}")
                self._check_rank(_rank_result(ref, pending.pop(ref)))

    def _check_rank(self, result: RankResult) -> None:
        if result.ok:
            return
        if result.detail:
            print(f"[ray] trainer rank {result.rank} traceback:\n{result.detail}", file=sys.stderr)
        raise RayJobError(f"trainer rank {result.rank} failed (exit code {result.code}): "
                          f"{result.error}{self._resume_hint()}")

    def _resume_hint(self) -> str:
        save = getattr(self.trainer_args, "save", None)
        if not save:
            return ""
        return (f"; the checkpoints in --save {save} stay: run the same command with "
                f"--load {save} to resume from the last one")

    def _await(self, refs: list, what: str, timeout: float) -> list:
        """Results of ``refs`` (one per actor) within ``timeout`` s, printing progress."""
        import ray

        begin = time.monotonic()
        while True:
            done, waiting = ray.wait(refs, num_returns=len(refs), timeout=placement.PROGRESS_EVERY)
            if not waiting:
                return [_get(ref, f"{what} {i}") for i, ref in enumerate(refs)]
            for ref in done:  # a failed start ends the wait at once
                _get(ref, f"{what} {refs.index(ref)}")
            late = [i for i, ref in enumerate(refs) if ref in waiting]
            elapsed = time.monotonic() - begin
            if elapsed > timeout:
                raise RayJobError(f"{what}(s) {late} not started within {timeout:.0f}s")
            print(f"[ray] waiting for {what}(s) {late}: {elapsed:.0f}s of {timeout:.0f}s",
                  flush=True)

    # --- actors and reservations -----------------------------------------------------------
    def _reserve(self, name: str, count: int, strategy: str):
        with phase(f"reserve {count} GPU(s) for {name} ({strategy})") as info:
            reservation = placement.reserve(name, count, strategy, self.opts.placement_timeout)
            self.reservations.append(reservation)
            info["detail"] = "on " + ", ".join(sorted(set(reservation.nodes)))
        return reservation

    def _actor(self, cls, reservation, position: int, **options):
        import ray

        handle = ray.remote(cls).options(num_cpus=1, num_gpus=1,
                                         scheduling_strategy=reservation.strategy(position),
                                         **options)
        return _Tracked(handle, self.actors)

    def _report(self) -> None:
        """What each engine serving now served: the proof that the work was spread (a replaced
        engine's earlier process is gone, and its counts with it)."""
        import ray

        if self.supervisor is None:
            return
        for i, url, counts, restarts in ray.get(self.supervisor.report.remote(), timeout=60):
            updates = sum(v for k, v in counts.items() if k.startswith("/update_weights"))
            again = f" since it was restarted ({restarts}x)" if restarts else ""
            print(f"[ray] rollout engine {i} ({url}) served {counts.get('/generate', 0)} "
                  f"/generate and {updates} weight update request(s){again}", flush=True)

    def stop(self) -> None:
        """Kill every actor (engine servers and the router go with them), free the GPUs."""
        import ray

        if not ray.is_initialized():
            return
        if self.supervisor is not None:  # first its engines: the driver has no handle on them
            try:
                ray.get(self.supervisor.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - killing the supervisor ends its engines too
                pass
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        for reservation in self.reservations:
            placement.release(reservation)
        cluster.shutdown()


class _Tracked:
    """``.remote(...)`` that records the new actor, so that :meth:`RayJob.stop` can kill it."""

    def __init__(self, handle, actors: list):
        self.handle, self.actors = handle, actors

    def remote(self, *args):
        actor = self.handle.remote(*args)
        self.actors.append(actor)
        return actor


def _this_node():
    """Soft affinity to the driver's node (actors of no GPU: the router, the supervisor)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)


def _get(ref, what: str):
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:
        raise RayJobError(f"{what}: its process died ({_first_line(e)})") from None
    except ray.exceptions.RayTaskError as e:
        raise RayJobError(f"{what} failed to start: {_cause(e)}") from None


def _rank_result(ref, rank: int) -> RankResult:
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:  # killed, out of memory, crashed
        return RankResult(rank, 1, f"its process died ({_first_line(e)})")
    except ray.exceptions.RayTaskError as e:
        return RankResult(rank, 1, _cause(e))


def _outcome(ref) -> str:
    import ray

    try:
        return str(ray.get(ref))
    except ray.exceptions.RayActorError as e:
        return f"its process died ({_first_line(e)})"
    except ray.exceptions.RayTaskError as e:
        return _cause(e)


def _cause(e) -> str:
    cause = getattr(e, "cause", None)
    return f"{type(cause).__name__}: {cause}" if cause is not None else _first_line(e)


def _first_line(e) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def trainer_args(opts: RayOptions, argv: list[str]):
    """The trainer's flags, parsed and checked by the trainer's own rules before any GPU is
    reserved (argparse exits naming the flag)."""
    from ..arguments import parse_args

    probe = [] if opts.colocate else ["--rollout-server-urls", "http://engines.invalid"]
    args = parse_args(argv + probe, prog=interrupt.prog("python -m trainer.ray_job"))
    model_parallel = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    if opts.trainer_gpus % model_parallel:
        raise RayJobError(f"{opts.trainer_gpus} trainer GPU(s) (--actor-num-nodes x "
                          f"--actor-num-gpus-per-node) are not divisible by "
                          f"--tensor-model-parallel-size x --pipeline-model-parallel-size = "
                          f"{model_parallel}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    interrupt.set_command(["python", "-m", "trainer.ray_job", *argv])
    opts, rest = options.parse(argv)
    job = None
    interrupt.install()  # Ctrl-C, and `kill` / a scheduler's SIGTERM, end the job the same way
    try:
        job = RayJob(opts, rest, trainer_args(opts, rest))
        with interrupt.doing("the Ray job (every trainer rank and engine is stopped)"):
            job.run()
        return 0
    except RayJobError as e:
        print(f"{interrupt.prog('trainer.ray_job')}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except (interrupt.Interrupted, SystemError) as e:
        if not _interrupted(e):
            raise
        if job is not None:  # the trainer ranks are Ray actors: no signal reaches them
            job.stop()
            job = None
        interrupt.say(interrupt.report(_save_dir(rest), interrupt.command([])))
        return interrupt.exit_code()
    finally:
        if job is not None:
            job.stop()


def _interrupted(error: BaseException) -> bool:
    """The signal handler's Interrupted, also when Ray's Cython wait loop (``check_signals``)
    re-raised it as a SystemError "returned a result with an exception set"."""
    return isinstance(error, interrupt.Interrupted) or (
        interrupt.received() is not None and isinstance(error.__cause__, interrupt.Interrupted))


def _save_dir(trainer_argv: list[str]) -> str | None:
    """``--save`` among the trainer's flags (parsed again: the job may not have been built)."""
    import argparse

    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--save", default=None)
    return probe.parse_known_args(trainer_argv)[0].save
