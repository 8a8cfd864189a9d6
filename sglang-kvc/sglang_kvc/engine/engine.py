"""The in-process engine (SGLang's `Engine` API): builds the model runner, the scheduler and the
engine thread (step_loop.py), and answers callers: generate / submit, abort, pause, memory
control (engine_memory.py), weight updates (engine_weights.py, then weights/updates.py) and
server info. Every call that touches engine state runs on the engine thread between steps."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import logging
import queue
import random
from pathlib import Path
from typing import Iterator

from ..kvcache import ownership
from ..models.config import ModelConfig
from ..server_args import ServerArgs, check_model_dir
from ..weights.updates import WeightUpdater
from .admission import Admission, Demand, QueueFull, check_n, counted, limits_from_args, token_shares
from .detokenizer import Detokenizer
from .engine_memory import EngineMemory
from .engine_weights import EngineWeights
from .finish import abort_reason
from .info import server_info
from .intake import IntakeLimits, UpdateFn, make_sequences, notifier
from .io_struct import GenerateItem, parse_generate
from .model_runner import ModelRunner
from .output import OutputBuilder
from .scheduler import Scheduler, SchedulerConfig
from .sessions import Sessions, check_open_args
from .step_loop import StepLoop

log = logging.getLogger(__name__)

# Tokens after which the reference's newline trigger fires (the last sub-token of each).
_NEWLINE_STRINGS = ("\n", ".\n", ")\n", "\n\n", ".\n\n", ")\n\n")


def _generation_config(model_path: str) -> dict:
    path = Path(model_path) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _as_id_set(x) -> set[int]:
    if x is None:
        return set()
    return {int(i) for i in (x if isinstance(x, (list, tuple)) else [x])}


def _load_tokenizer(args: ServerArgs):
    if args.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)


def _eos_ids(cfg: ModelConfig, gen: dict, tokenizer) -> set[int]:
    """EOS = config's, generation_config's (Qwen lists several) and the tokenizer's."""
    ids = _as_id_set(cfg.hf_config.eos_token_id) | _as_id_set(gen.get("eos_token_id"))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _sampling_defaults(args: ServerArgs, gen: dict) -> dict:
    if args.sampling_defaults != "model":
        return {}
    keys = ("temperature", "top_p", "top_k", "min_p")
    defaults = {k: gen[k] for k in keys if k in gen}
    if defaults.get("top_k") == 0:
        defaults["top_k"] = -1
    return defaults


def _compression_token_ids(args: ServerArgs, tokenizer) -> tuple[set[int] | None, int | None]:
    if args.compress_algorithm is None or tokenizer is None:
        return None, None
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    newline_ids = {enc(t)[-1] for t in _NEWLINE_STRINGS if enc(t)}
    think = enc("</think>")
    # Only a single-token </think> is a reliable marker; a split one would match its last piece.
    think_end_id = think[0] if len(think) == 1 else None
    return newline_ids, think_end_id


def _freeze_startup_heap() -> None:
    """Move what exists after startup (torch, transformers, the model: ~0.5M objects) out of the
    cyclic GC's reach. Responses with log-probs allocate one small list per token, which
    triggers full collections; each walked the whole startup heap: 0.31 s of a 256 x 512-token
    batch's output building instead of 0.03 s (the 0.5 s end-to-end gap of T = 1 + log-probs
    against greedy on an H100)."""
    gc.collect()
    gc.freeze()


class Engine(EngineWeights, EngineMemory):
    """SGLang's in-process engine. Its weight-update calls come from ``EngineWeights``
    (engine_weights.py), its memory release / resume from ``EngineMemory`` (engine_memory.py)."""

    def __init__(self, model_path: str | None = None, server_args: ServerArgs | None = None, **kwargs):
        from transformers import AutoConfig

        args = server_args or ServerArgs(model_path=model_path, **kwargs)
        if not args.model_path:
            raise ValueError("model_path is required")
        if problem := check_model_dir(args.model_path, "model_path"):
            raise FileNotFoundError(problem)
        self.args = args
        self.model_config = ModelConfig.from_hf(AutoConfig.from_pretrained(args.model_path))
        self.tokenizer = _load_tokenizer(args)
        gen = _generation_config(args.model_path)
        self.eos_ids = _eos_ids(self.model_config, gen, self.tokenizer)
        self.sampling_defaults = _sampling_defaults(args, gen)
        newline_ids, think_end_id = _compression_token_ids(args, self.tokenizer)
        self.runner = ModelRunner(args, self.model_config, self.eos_ids, newline_ids, think_end_id)
        self.kv, self.compressor = self.runner.kv, self.runner.compressor
        self.context_length = self.runner.context_length
        # A request never grows past what the pool can hold alone, so it can always run.
        self.max_seq_len = min(self.context_length, self.kv.capacity)
        ring = self.runner.attn.ring
        self.scheduler = Scheduler(
            SchedulerConfig(args.max_running_requests, args.max_prefill_tokens,
                            max_seq_len=self.max_seq_len,
                            prefill_delay_steps=args.schedule_prefill_delay_steps,
                            match_tail=ring.window if ring is not None else 1), self.kv,
            bound=self.compressor.bound if self.compressor is not None else None,
            cow=self.compressor.cow_slots if self.compressor is not None else None)
        self.detok = Detokenizer(self.tokenizer)
        self.overlap = not args.disable_overlap_schedule
        self.outputs = OutputBuilder(self.tokenizer, self.detok, self.compressor, args.weight_version)
        mc = self.model_config
        self._limits = IntakeLimits(mc.vocab_size, self.max_seq_len,
                                    (mc.num_layers, mc.num_kv_heads), self.runner.compression)
        self._rng = random.Random(args.random_seed)
        self.admission = Admission(limits_from_args(args, self.kv.capacity))
        self.accepting = True
        _freeze_startup_heap()
        self.sessions = Sessions(self.kv, self.scheduler)
        self.scheduler.reclaim = self.sessions.drop_lru
        self.loop = StepLoop(self.runner, self.scheduler, self.outputs, self.max_seq_len, self.overlap,
                             self.sessions)
        if ownership.enabled():
            self.loop.check_kv = self._check_kv
        self.weights = WeightUpdater(self.runner, self.loop.call, self._abort_all, self._set_version)

    # ================================================================ requests

    def generate(self, prompt=None, input_ids=None, sampling_params=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False, compress=None, return_eviction_record=None,
                 compress_budget=None, session_params=None):
        """SGLang's Engine.generate: single or batched prompts; returns a dict, or a list for a
        batch or n > 1; with stream=True an iterator of cumulative output dicts (one prompt).
        `session_params` ({"id", "rid"}, a list for a batch): continue a session's request."""
        body = {"text": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
                "return_logprob": return_logprob, "return_text_in_logprobs": return_text_in_logprobs,
                "rid": rid, "stream": stream, "logprob_start_len": logprob_start_len,
                "top_logprobs_num": top_logprobs_num, "compress": compress,
                "compress_budget": compress_budget,
                "return_eviction_record": return_eviction_record, "session_params": session_params}
        items, is_batch = parse_generate({k: v for k, v in body.items() if v is not None},
                                         self.sampling_defaults)
        if stream:
            return self._stream(items)
        results = [f.result() for f in self.submit(items)]
        return results if (is_batch or len(results) > 1) else results[0]

    def _stream(self, items) -> Iterator[dict]:
        q: queue.SimpleQueue = queue.SimpleQueue()
        futures = self.submit(items, on_update=lambda out, fin: q.put((out, fin)))
        remaining = len(futures)
        while remaining:
            out, fin = q.get()
            remaining -= fin
            yield out

    def submit(self, items: list[GenerateItem], on_update: UpdateFn | None = None) -> list:
        """Validate, admit (admission.py: ValueError or QueueFull) and enqueue; one future (final
        output dict) per sample, prompt-major."""
        if self.loop.stopped:
            raise RuntimeError("engine is shut down")
        if not self.accepting:
            raise QueueFull("server shutting down: not accepting requests")
        check_n(items, self.admission.limits.max_n)  # before n samples are built
        self.admission.check_alone(Demand(sum(it.params.n for it in items), 0))
        contexts = [self.sessions.resolve(it.session, it.return_eviction_record)
                    if it.session is not None else None for it in items]
        seqs = [s for it, ctx in zip(items, contexts)
                for s in make_sequences(it, self.tokenizer, self._limits, self._rng, ctx)]
        shares = token_shares(seqs, self.max_seq_len, shared=self.kv.prefix is not None)
        self.admission.admit(Demand(len(seqs), sum(shares)))
        futures = []
        for seq, tokens in zip(seqs, shares):
            fut: concurrent.futures.Future = concurrent.futures.Future()
            seq.on_update = counted(notifier(fut, on_update), self.admission, tokens)
            futures.append(fut)
        self.loop.put(seqs)
        return futures

    def submit_generate(self, body: dict, on_update: UpdateFn | None = None) -> list:
        """A `/generate` request body (SGLang's JSON, batched lists included), parsed as the
        HTTP server parses it; one future per sample, prompt-major (as `submit`)."""
        items, _ = parse_generate(body, self.sampling_defaults)
        return self.submit(items, on_update)

    # ================================================================ sessions (sessions.py)

    def open_session(self, capacity_of_str_len: int = 0, session_id: str | None = None) -> str:
        """SGLang's open_session: a session whose requests continue each other's KV; returns its
        id (`session_id`, or a new one). `capacity_of_str_len` is accepted and unused."""
        check_open_args(capacity_of_str_len, session_id)
        return self.loop.call(self.sessions.open, session_id)

    def close_session(self, session_id: str) -> None:
        """Close a session and free the KV its finished requests hold (ValueError if unknown)."""
        if not isinstance(session_id, str):
            raise ValueError("session_id must be a string")
        self.loop.call_beside_step(self.sessions.close, session_id)

    def open_sessions(self, count: int) -> list[str]:
        """``count`` new sessions in one hop to the engine thread (a rollout's episodes open
        theirs together instead of waiting for a step boundary each)."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError("count must be a non-negative integer")
        return self.loop.call(self.sessions.open_many, count)

    def close_sessions(self, session_ids: list[str]) -> list[str]:
        """Close several sessions in one hop (one step boundary for all of them); returns the
        ids that were not open (they held nothing)."""
        if not all(isinstance(s, str) for s in session_ids):
            raise ValueError("session ids must be strings")
        return self.loop.call_beside_step(self.sessions.close_many, list(session_ids))

    def abort_request(self, rid: str = "", abort_all: bool = False) -> int:
        return self.loop.call(self.loop.abort, rid, abort_all, "Aborted by request")

    def abort_requests(self, rids: list[str], message: str = "Aborted: client disconnected") -> int:
        """Abort several requests (or the n samples of each) in one pass over the queue."""
        return self.loop.call(self._abort_rids, set(rids), message)

    def begin_shutdown(self) -> None:
        """Refuse new requests (503) and abort everything queued or running, so HTTP handlers
        answer at once and the server can exit (SIGTERM)."""
        self.accepting = False
        if not self.loop.stopped:
            self.loop.call(self._abort_all, "Server shutting down")

    def pause_generation(self, mode: str = "in_place") -> None:
        if mode not in ("in_place", "abort", "retract"):
            raise ValueError("mode must be one of in_place, abort, retract")
        self.loop.call(self._pause, mode)

    def continue_generation(self) -> None:
        self.loop.call(self._continue)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; succeeds only when idle, as SGLang's does."""
        return self.loop.call(self._flush)

    # ================================================================ info, lifetime

    @property
    def device(self):
        """The torch device the engine's model and KV pool live on (``cuda:1``, ``cpu``)."""
        return self.runner.device

    @property
    def step_stats(self):
        return self.loop.step_stats

    def get_server_info(self) -> dict:
        return server_info(self)

    def get_model_info(self) -> dict:
        return {"model_path": self.args.model_path,
                "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.weight_version}

    def is_alive(self) -> bool:
        return self.loop.is_alive()

    def shutdown(self) -> None:
        if self.loop.stopped:
            return
        try:
            self.loop.call(self.loop.abort, "", True, "Engine shut down")
        finally:
            self.loop.stop()
            self.runner.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ================================================================ commands (engine thread)

    def _abort_all(self, message: str) -> int:
        return self.loop.abort("", True, message)

    def _abort_rids(self, rids: set[str], message: str) -> int:
        sch = self.scheduler
        victims = [s for s in list(sch.running) + list(sch.waiting)
                   if s.rid in rids or s.group_rid in rids]
        for seq in victims:
            self.loop.finish(seq, abort_reason(message))
        return len(victims)

    def _check_kv(self) -> None:
        """(debug mode) Every KV slot has one owner (kvcache/ownership.py)."""
        if not self.kv.pool.allocated:
            return
        sch = self.scheduler
        rows = [s for s in list(sch.running) + list(sch.waiting) if s.row is not None]
        ownership.check(self.kv, rows + self.sessions.parked())

    def _flush(self) -> bool:
        if self.scheduler.running or self.scheduler.waiting:
            return False
        self.kv.flush()
        return True

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            self._abort_all("Aborted by pause_generation")
        elif mode == "retract":
            self.scheduler.retract_all()
        self.scheduler.paused = True

    def _continue(self) -> None:
        self.scheduler.paused = False
