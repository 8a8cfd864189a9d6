"""The engine thread: `schedule -> launch -> process` steps, and the inbox that feeds it.

One background thread owns the model, the KV cache and the scheduler. Everything else (HTTP
handlers, `generate` callers) talks to it through a FIFO inbox: new requests and control commands
(abort, weight updates, pause, ...) are applied between steps in arrival order, so no lock guards
the engine state.

Overlap scheduling (SGLang's default too): the thread launches step N+1 before it reads step N's
tokens, so scheduling, input preparation and output processing run while the GPU computes. A
request that ended at step N (EOS, stop string) therefore rides along in step N+1, whose token
for it is dropped; limits the host knows in advance (max_new_tokens, context length) never cost
that extra step. Control commands first finish the step in flight, so they see settled state.
`--disable-overlap-schedule` reads every step's outputs before launching the next.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .finish import abort_reason, check_finish, error_reason
from .model_runner import ModelRunner
from .output import OutputBuilder
from .scheduler import Batch, Scheduler
from .sequence import Sequence, Status
from .sessions import Sessions
from .step_io import PendingStep, StepOutput, bind_thread
from .token_intake import RowPlan, append_plain, plan_rows

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    """Where the engine thread's time goes on decode steps: host = everything but waiting for
    the GPU's outputs (schedule, launch, output processing, compression launches)."""
    decode_steps: int = 0
    host_s: float = 0.0
    gpu_wait_s: float = 0.0
    # the rest of the thread's time: prefill steps, commands run between steps (session
    # opens/closes, aborts, ...), and waiting for work with nothing to run
    prefill_steps: int = 0
    prefill_s: float = 0.0
    commands: int = 0
    command_s: float = 0.0
    idle_s: float = 0.0

    def add(self, loop_s: float, wait_s: float) -> None:
        self.decode_steps += 1
        self.host_s += loop_s - wait_s
        self.gpu_wait_s += wait_s

    def add_prefill(self, loop_s: float) -> None:
        self.prefill_steps += 1
        self.prefill_s += loop_s

    def add_command(self, seconds: float) -> None:
        self.commands += 1
        self.command_s += seconds

    def to_dict(self) -> dict:
        n = max(self.decode_steps, 1)
        return {"decode_steps": self.decode_steps, "host_ms_per_step": 1e3 * self.host_s / n,
                "gpu_wait_ms_per_step": 1e3 * self.gpu_wait_s / n,
                "decode_s": self.host_s + self.gpu_wait_s, "prefill_steps": self.prefill_steps,
                "prefill_s": self.prefill_s, "commands": self.commands,
                "command_s": self.command_s, "idle_s": self.idle_s}


class StepLoop:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, outputs: OutputBuilder,
                 max_seq_len: int, overlap: bool, sessions: Sessions | None = None):
        self.runner, self.scheduler, self.outputs = runner, scheduler, outputs
        self.sessions = sessions
        self.max_seq_len, self.overlap = max_seq_len, overlap
        self._inflight: PendingStep | None = None
        self._plan: RowPlan | None = None  # the decode batch's constants (token_intake.py)
        self._waited_s = 0.0  # total time blocked on step outputs
        self.step_stats = StepStats()
        self.num_steps = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self.stopped = False
        # Debug mode (kvcache/ownership.py): the KV ownership check after every step and command.
        self.check_kv: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="sglang-kvc-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- callers' side

    def put(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._inbox.put(("seq", seq))
        self._wake.set()

    def call(self, fn, *args):
        """Run fn(*args) on the engine thread between steps and return its result; the step in
        flight is processed first, so fn sees every launched step's outcome."""
        return self._call(fn, args, settle=True)

    def call_beside_step(self, fn, *args):
        """`call` without processing the step in flight first: for commands that touch nothing
        that step reads or settles (closing sessions frees parked requests' KV; a request the
        step finishes later is freed as usual). Settling costs the GPU's step time and the
        overlap of the next step's host work: ~3 ms a call on an H200 for SmolLM2, and a
        multi-turn rollout closes a session per finished episode (~100 calls a rollout)."""
        return self._call(fn, args, settle=False)

    def _call(self, fn, args, settle: bool):
        if threading.current_thread() is self._thread:
            return fn(*args)
        if self.stopped:
            raise RuntimeError("engine is shut down")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("cmd", fn, args, fut, settle))
        self._wake.set()
        return fut.result()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self.stopped

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()
        self._thread.join(timeout=30)

    # ---------------------------------------------------------------- engine thread

    def _drain_inbox(self, take_seq: Callable[[Sequence], None],
                     take_cmd: Callable[..., None]) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "seq":
                take_seq(msg[1])
            else:
                take_cmd(*msg[1:])

    def _run_command(self, fn, args, fut: concurrent.futures.Future, settle: bool = True) -> None:
        begin = time.perf_counter()  # counted with the step in flight it settles first
        if settle:
            self._complete_inflight()  # commands see every launched step processed
        try:
            result = fn(*args)
            if self.check_kv is not None:
                self.check_kv()
            fut.set_result(result)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        self.step_stats.add_command(time.perf_counter() - begin)

    def _run(self) -> None:
        try:
            bind_thread(self.runner.device)  # before the first step: see bind_thread
            while not self.stopped:
                self._iterate()
                if self.check_kv is not None:
                    self.check_kv()  # a broken invariant ends the thread: every caller hears
            self._complete_inflight()
        except BaseException as e:  # noqa: BLE001 - a dead engine thread must not hang callers
            log.critical("engine thread died", exc_info=e)
            self.stopped = True
            self._fail_everything(e)

    def _iterate(self) -> None:
        self._drain_inbox(self._take, self._run_command)
        t0, waited0 = time.perf_counter(), self._waited_s
        step = self._launch_next()
        completed = self._complete_inflight()
        if step is None:
            if not completed:
                self._idle()
            return
        self._inflight = step
        self._after_launch(step)
        if not self.overlap:
            self._complete_inflight()
        if not step.batch.is_prefill:
            self.step_stats.add(time.perf_counter() - t0, self._waited_s - waited0)
        else:
            self.step_stats.add_prefill(time.perf_counter() - t0)

    def _idle(self) -> None:
        begin = time.perf_counter()
        self._wake.wait(timeout=0.05)
        self._wake.clear()
        self.step_stats.idle_s += time.perf_counter() - begin

    def _take(self, seq: Sequence) -> None:
        if seq.parent_rid is not None and self.sessions is not None:
            self.sessions.adopt(seq)  # the KV its session's previous request left
        self.scheduler.add(seq)

    def _fail_everything(self, e: BaseException) -> None:
        """Answer every request and queued command with the error (the thread is gone)."""
        reason = error_reason(f"engine died: {e!r}", e)
        sch = self.scheduler
        for seq in list(sch.running) + list(sch.waiting):
            self.finish(seq, reason)
        self._drain_inbox(lambda seq: self.finish(seq, reason),
                          lambda fn, args, fut, *_: fut.set_exception(RuntimeError(f"engine died: {e!r}")))

    def _launch_next(self) -> PendingStep | None:
        batch = self.scheduler.schedule() if self.runner.kv.pool.allocated else None
        if batch is None:
            return None
        try:
            return self.runner.launch(batch)
        except Exception as e:  # noqa: BLE001 - fail the batch, keep serving
            self._fail(batch, e)
            return None

    def _after_launch(self, step: PendingStep) -> None:
        """Compression for the launched step: its trigger reads the tokens this step fed, known
        once the previous step was processed (done just before)."""
        try:
            self.runner.after_step(step.batch)
        except Exception as e:  # noqa: BLE001
            self._inflight = None
            self._fail(step.batch, e)

    def _complete_inflight(self) -> bool:
        """Wait for the step in flight, if any, and hand its tokens to the requests."""
        step, self._inflight = self._inflight, None
        if step is None:
            return False
        try:
            out = step.result()
        except Exception as e:  # noqa: BLE001
            self._fail(step.batch, e)
            return True
        finally:
            self._waited_s += step.wait_s
        self.num_steps += 1
        self._process(step.batch, out)
        return True

    def _fail(self, batch: Batch, e: Exception) -> None:
        log.error("step failed", exc_info=e)
        for seq in batch.seqs:
            self.finish(seq, error_reason(f"engine error: {e}", e))

    def _process(self, batch: Batch, out: StepOutput) -> None:
        if batch.is_prefill or out.stop_hits is None:
            return self._process_each(batch, out)
        plan = self._row_plan(batch)
        check, general = append_plain(batch.seqs, out.token_ids, out.logprobs, out.stop_hits, plan)
        for i in check:
            seq = batch.seqs[i]
            reason = check_finish(seq, out.token_ids[i], out.stop_hits[i], self.max_seq_len,
                                  self.outputs.detok)
            if reason is not None:
                self.finish(seq, reason)
        for i in general:
            self._take_token(batch.seqs[i], out, i)

    def _row_plan(self, batch: Batch) -> RowPlan:
        key = (batch.version, len(batch.seqs))
        if self._plan is None or self._plan.key != key or batch.version < 0:
            self._plan = plan_rows(batch.seqs, key, self.max_seq_len)
        return self._plan

    def _process_each(self, batch: Batch, out: StepOutput) -> None:
        input_lp = out.input_logprobs  # prefill steps only: decode steps skip the lookup
        for i, seq in enumerate(batch.seqs):
            if seq.finished:  # ended at the step before (overlap) or aborted: token dropped
                continue
            if input_lp and i in input_lp:
                seq.input_logprobs, seq.input_top_logprobs = input_lp[i]
            if seq.params.max_new_tokens == 0:
                self.finish(seq, {"type": "length", "length": 0})
                continue
            self._take_token(seq, out, i)

    def _take_token(self, seq: Sequence, out: StepOutput, i: int) -> None:
        tok = out.token_ids[i]
        seq.output_ids.append(tok)
        if out.logprobs is not None:
            seq.output_logprobs.append(out.logprobs[i])
        if seq.top_logprobs_num:
            seq.output_top_logprobs.append(out.top_logprobs[i][:seq.top_logprobs_num])
        reason = check_finish(seq, tok, out.stop_hits[i], self.max_seq_len, self.outputs.detok)
        if reason is not None:
            self.finish(seq, reason)
        elif seq.stream:
            if not seq.params.stop:
                self.outputs.detok.update(seq)
            seq.on_update(self.outputs.build(seq, final=False), False)

    def finish(self, seq: Sequence, reason: dict) -> None:
        if seq.finished:
            return
        kept = seq.session_id is not None and self.sessions is not None and self.sessions.park(seq, reason)
        if not kept:
            self.scheduler.remove(seq)
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.finished_at = time.time()
        seq.on_update(self.outputs.build(seq, final=True), True)
        if kept:  # its session keeps the request until closed, not its response (the callback's)
            seq.on_update = None

    def abort(self, rid: str, abort_all: bool, message: str) -> int:
        """(engine thread) End the matching requests, running or waiting."""
        victims = [s for s in list(self.scheduler.running) + list(self.scheduler.waiting)
                   if abort_all or s.rid == rid or s.group_rid == rid]
        for seq in victims:
            self.finish(seq, abort_reason(message))
        return len(victims)
