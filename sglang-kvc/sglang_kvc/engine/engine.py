"""The in-process engine: request intake, the step loop, finish rules, control operations.

One background thread owns the model, the KV cache and the scheduler and runs
`schedule -> launch -> process` steps. Everything else (HTTP handlers, `generate` callers) talks
to it through a FIFO inbox: new requests and control commands (abort, weight updates, pause, ...)
are applied between steps in arrival order, so no lock guards the engine state.

Overlap scheduling (SGLang's default too): the thread launches step N+1 before it reads step N's
tokens, so scheduling, input preparation and output processing run while the GPU computes. A
request that ended at step N (EOS, stop string) therefore rides along in step N+1, whose token
for it is dropped; limits the host knows in advance (max_new_tokens, context length) never cost
that extra step. Control commands first finish the step in flight, so they see settled state.
`--disable-overlap-schedule` reads every step's outputs before launching the next.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .. import __version__
from .detokenizer import Detokenizer
from .io_struct import GenerateItem, parse_generate
from ..models.config import ModelConfig
from .model_runner import ModelRunner, PendingStep, StepOutput
from .scheduler import Batch, Scheduler, SchedulerConfig
from .sequence import Sequence, Status
from ..server_args import ServerArgs
from ..weights.transport import (WeightUpdateGroup, bucket_layout, deserialize_ipc_bucket,
                          deserialize_named_tensors, receive_each, receive_flattened)
from ..weights.loader import _destination as weight_destination
from ..weights.loader import iter_safetensors, safetensors_shapes, validate_shapes

log = logging.getLogger(__name__)

UpdateFn = Callable[[dict, bool], Any]  # (output dict, finished)


@dataclass
class StepStats:
    """Where the engine thread's time goes on decode steps: host = everything but waiting for
    the GPU's outputs (schedule, launch, output processing, compression launches)."""
    decode_steps: int = 0
    host_s: float = 0.0
    gpu_wait_s: float = 0.0

    def add(self, loop_s: float, wait_s: float) -> None:
        self.decode_steps += 1
        self.host_s += loop_s - wait_s
        self.gpu_wait_s += wait_s

    def to_dict(self) -> dict:
        n = max(self.decode_steps, 1)
        return {"decode_steps": self.decode_steps, "host_ms_per_step": 1e3 * self.host_s / n,
                "gpu_wait_ms_per_step": 1e3 * self.gpu_wait_s / n,
                "decode_s": self.host_s + self.gpu_wait_s}


_MEMORY_TAGS = {"kv_cache", "weights", "cuda_graph"}


def _error_reason(message: str, e: BaseException) -> dict:
    """finish_reason of a request ended by an engine failure (HTTP 500 to the client)."""
    return {"type": "abort", "message": message, "status_code": 500, "err_type": type(e).__name__}


def _generation_config(model_path: str) -> dict:
    path = Path(model_path) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _as_id_set(x) -> set[int]:
    if x is None:
        return set()
    return {int(i) for i in (x if isinstance(x, (list, tuple)) else [x])}


class Engine:
    def __init__(self, model_path: str | None = None, server_args: ServerArgs | None = None, **kwargs):
        from transformers import AutoConfig

        args = server_args or ServerArgs(model_path=model_path, **kwargs)
        if not args.model_path:
            raise ValueError("model_path is required")
        self.args = args
        self.model_config = ModelConfig.from_hf(AutoConfig.from_pretrained(args.model_path))
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
        gen = _generation_config(args.model_path)
        # EOS = config's, generation_config's (Qwen lists several) and the tokenizer's.
        self.eos_ids = (_as_id_set(self.model_config.hf_config.eos_token_id)
                        | _as_id_set(gen.get("eos_token_id")))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self.sampling_defaults = {}
        if args.sampling_defaults == "model":
            keys = ("temperature", "top_p", "top_k", "min_p")
            self.sampling_defaults = {k: gen[k] for k in keys if k in gen}
            if self.sampling_defaults.get("top_k") == 0:
                self.sampling_defaults["top_k"] = -1

        newline_ids, think_end_id = self._compression_token_ids()
        self.runner = ModelRunner(args, self.model_config, self.eos_ids, newline_ids, think_end_id)
        self.kv = self.runner.kv
        self.compressor = self.runner.compressor
        self.context_length = self.runner.context_length
        # A request never grows past what the pool can hold alone, so it can always run.
        self.max_seq_len = min(self.context_length, self.kv.capacity)
        self.scheduler = Scheduler(
            SchedulerConfig(args.max_running_requests, args.max_prefill_tokens,
                            max_seq_len=self.max_seq_len), self.kv,
            bound=self.compressor.bound if self.compressor is not None else None)
        self.detok = Detokenizer(self.tokenizer)
        self.overlap = not args.disable_overlap_schedule
        self._inflight: PendingStep | None = None
        self._waited_s = 0.0  # total time blocked on step outputs
        self.step_stats = StepStats()
        self.weight_version = args.weight_version
        self.weight_groups: dict[str, WeightUpdateGroup] = {}
        self._rng = random.Random(args.random_seed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopped = False
        self.num_steps = 0
        self._thread = threading.Thread(target=self._loop, name="sglang-kvc-engine", daemon=True)
        self._thread.start()

    # Tokens after which the reference's newline trigger fires (the last sub-token of each).
    _NEWLINE_STRINGS = ("\n", ".\n", ")\n", "\n\n", ".\n\n", ")\n\n")

    def _compression_token_ids(self) -> tuple[set[int] | None, int | None]:
        if self.args.compress_algorithm is None or self.tokenizer is None:
            return None, None
        enc = lambda t: self.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        newline_ids = {enc(t)[-1] for t in self._NEWLINE_STRINGS if enc(t)}
        think = enc("</think>")
        # Only a single-token </think> is a reliable marker; a split one would match its last piece.
        think_end_id = think[0] if len(think) == 1 else None
        return newline_ids, think_end_id

    # ================================================================ public API

    def generate(self, prompt=None, input_ids=None, sampling_params=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False):
        """SGLang's Engine.generate: single or batched prompts; returns a dict, or a list for a
        batch or n > 1; with stream=True an iterator of cumulative output dicts (one prompt)."""
        body = {"text": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
                "return_logprob": return_logprob, "return_text_in_logprobs": return_text_in_logprobs,
                "rid": rid, "stream": stream}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        items, is_batch = parse_generate({k: v for k, v in body.items() if v is not None},
                                         self.sampling_defaults)
        if stream:
            return self._stream(items)
        futures = self.submit(items)
        results = [f.result() for f in futures]
        return results if (is_batch or len(results) > 1) else results[0]

    def _stream(self, items) -> Iterator[dict]:
        q: queue.SimpleQueue = queue.SimpleQueue()
        futures = self.submit(items, on_update=lambda out, fin: q.put((out, fin)))
        remaining = len(futures)
        while remaining:
            out, fin = q.get()
            remaining -= fin
            yield out

    def submit(self, items: list[GenerateItem], on_update: UpdateFn | None = None
               ) -> list[concurrent.futures.Future]:
        """Validate and enqueue; one future (final output dict) per sample, prompt-major."""
        if self._stopped:
            raise RuntimeError("engine is shut down")
        seqs = [s for it in items for s in self._make_seqs(it)]
        futures = []
        for seq in seqs:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            seq.on_update = self._notifier(fut, on_update)
            futures.append(fut)
        for seq in seqs:
            self._inbox.put(("seq", seq))
        self._wake.set()
        return futures

    def abort_request(self, rid: str = "", abort_all: bool = False) -> int:
        return self._call(self._abort, rid, abort_all, "Aborted by request")

    def pause_generation(self, mode: str = "in_place") -> None:
        if mode not in ("in_place", "abort", "retract"):
            raise ValueError("mode must be one of in_place, abort, retract")
        self._call(self._pause, mode)

    def continue_generation(self) -> None:
        self._call(self._continue)

    def flush_cache(self) -> bool:
        """No prefix cache to drop; succeeds only when idle, as SGLang's does."""
        return self._call(lambda: not (self.scheduler.running or self.scheduler.waiting))

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                 weight_version: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = True) -> dict:
        if load_format not in (None, "auto", "safetensors"):
            raise ValueError(f"load_format {load_format!r} not supported")
        validate_shapes(self.runner.model, safetensors_shapes(model_path))
        return self._call(self._update_weights, lambda: iter_safetensors(model_path),
                          weight_version, abort_all_requests)

    def update_weights_from_tensor(self, named_tensors=None, serialized_named_tensors=None,
                                   load_format: str | None = None, weight_version: str | None = None,
                                   abort_all_requests: bool = False, flush_cache: bool = True) -> dict:
        """`named_tensors`: list of (hf_name, tensor) in process; or the HTTP payload formats
        (weight_sync.py) as `serialized_named_tensors`: base64 torch.save, or with
        `load_format="ipc"` a handle to a flattened bucket in another process on this host."""
        if load_format not in (None, "direct", "ipc"):
            raise ValueError(f"load_format {load_format!r} not supported (None, direct or ipc)")
        if named_tensors is None:
            if (not isinstance(serialized_named_tensors, list) or not serialized_named_tensors
                    or not isinstance(serialized_named_tensors[0], str)):
                raise ValueError("serialized_named_tensors must be a non-empty list of strings")
            decode = deserialize_ipc_bucket if load_format == "ipc" else deserialize_named_tensors
            named_tensors = decode(serialized_named_tensors[0])
        named = list(named_tensors)
        try:
            validate_shapes(self.runner.model, [(n, tuple(t.shape)) for n, t in named])
            return self._call(self._update_weights, lambda: iter(named), weight_version,
                              abort_all_requests)
        finally:
            # drop the views into an IPC buffer before answering: the sender frees it on the answer
            named.clear()

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                  world_size: int, group_name: str = "weight_update_group",
                                  backend: str | None = None) -> dict:
        if group_name in self.weight_groups:
            raise ValueError(f"weight update group {group_name!r} already exists")
        backend = backend or ("nccl" if self.runner.device.type == "cuda" else "gloo")
        if backend == "nccl" and self.runner.device.type != "cuda":
            backend = "gloo"  # NCCL needs GPUs; a CPU engine joins over gloo
        # Rendezvous blocks until the trainer joins; done off the engine thread so steps go on.
        group = WeightUpdateGroup(master_address, master_port, rank_offset, world_size, backend, group_name)
        self.weight_groups[group_name] = group
        return {"success": True, "message": f"joined {group_name} as rank {rank_offset} ({backend})"}

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group",
                                        weight_version: str | None = None,
                                        abort_all_requests: bool = False, flush_cache: bool = True,
                                        load_format: str | None = None) -> dict:
        """Receive `names` from the group's rank 0: one broadcast per tensor, or with
        `load_format="flattened_bucket"` one broadcast of all their bytes back to back."""
        group = self.weight_groups.get(group_name)
        if group is None:
            raise ValueError(f"no weight update group named {group_name!r}")
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r} not supported (None or flattened_bucket)")
        entries = bucket_layout(names, dtypes, shapes)
        validate_shapes(self.runner.model, [(e.name, e.shape) for e in entries])
        device = self.runner.device if group.backend == "nccl" else torch.device("cpu")
        receive = receive_flattened if load_format == "flattened_bucket" else receive_each
        return self._call(self._update_weights, lambda: receive(group, entries, device),
                          weight_version, abort_all_requests)

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """SGLang's /get_weights_by_name: the first `truncate_size` rows of an HF-named weight as
        the engine holds it (after any update), as nested lists."""
        if not isinstance(name, str):
            raise ValueError(f"name must be a string, got {name!r}")
        if not isinstance(truncate_size, int) or isinstance(truncate_size, bool) or truncate_size < 1:
            raise ValueError(f"truncate_size must be a positive integer, got {truncate_size!r}")
        return self._call(self._weight_rows, name, truncate_size)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        group = self.weight_groups.pop(group_name, None)
        if group is None:
            raise ValueError(f"no weight update group named {group_name!r}")
        group.destroy()
        return {"success": True, "message": f"destroyed {group_name}"}

    def release_memory(self, tags: list[str] | None = None) -> None:
        self._call(self._release, set(tags or _MEMORY_TAGS))

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self._call(self._resume, set(tags or _MEMORY_TAGS))

    def get_server_info(self) -> dict:
        kv = self.kv
        used = kv.capacity - kv.num_free
        info = self.args.to_dict()
        info.update({
            "version": __version__,
            "max_total_num_tokens": kv.capacity,
            "context_length": self.context_length,
            "kv_pool": {"capacity": kv.capacity, "used": used, "free": kv.num_free,
                        "usage": used / kv.capacity, "allocated": kv.pool.allocated,
                        "bytes": kv.pool.bytes, "peak_used": kv.allocator.peak_used,
                        "bytes_per_slot": kv.pool.bytes // kv.pool.num_slots},
            "num_running_reqs": len(self.scheduler.running),
            "num_waiting_reqs": len(self.scheduler.waiting),
            "num_preemptions": self.scheduler.num_preemptions,
            "paused": self.scheduler.paused,
            "weight_version": self.weight_version,
            "resolved_device": str(self.runner.device),
            "resolved_dtype": str(self.runner.dtype).removeprefix("torch."),
            "resolved_attention_backend": self.runner.backend_name,
            "max_running_reqs_seen": self.scheduler.max_running,
            "overlap_schedule": self.overlap,
            "step_stats": self.step_stats.to_dict(),
        })
        c = self.compressor
        if c is not None:
            info["compression"] = {
                "algorithm": c.cfg.algorithm, "budget": c.cfg.budget,
                "divide_length": c.cfg.divide_length, "selection": c.cfg.mode,
                "num_compressions": c.num_compressions, "tokens_evicted": c.tokens_evicted,
                "query_ring_bytes": c.ring.bytes if c.ring is not None else 0}
        info["internal_states"] = [{k: info[k] for k in (
            "num_running_reqs", "num_waiting_reqs", "num_preemptions", "max_total_num_tokens")}]
        return info

    def get_model_info(self) -> dict:
        return {"model_path": self.args.model_path,
                "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.weight_version}

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def shutdown(self) -> None:
        if self._stopped:
            return
        try:
            self._call(self._abort, "", True, "Engine shut down")
        finally:
            self._stopped = True
            self._wake.set()
            self._thread.join(timeout=30)
            self.runner.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ================================================================ request intake

    def _make_seqs(self, item: GenerateItem) -> list[Sequence]:
        if item.input_ids is not None:
            ids = item.input_ids
        else:
            if self.tokenizer is None:
                raise ValueError("text input needs a tokenizer (server runs --skip-tokenizer-init)")
            ids = self.tokenizer.encode(item.text)
            if not ids:
                raise ValueError("text tokenizes to no tokens")
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            bad = [t for t in ids if not 0 <= t < vocab]
            raise ValueError(f"token id(s) {bad[:5]} out of vocabulary [0, {vocab})")
        if len(ids) >= self.max_seq_len:
            raise ValueError(f"the input ({len(ids)} tokens) is longer than the model's context "
                             f"length ({self.max_seq_len} tokens)")
        if item.logprob_start_len >= len(ids):
            raise ValueError(f"logprob_start_len ({item.logprob_start_len}) must be < the prompt "
                             f"length ({len(ids)})")
        n = item.params.n
        seqs = []
        for i in range(n):
            if item.params.sampling_seed is not None:
                seed = (item.params.sampling_seed + i) & 0xFFFFFFFF
            else:
                seed = self._rng.getrandbits(32)
            seqs.append(Sequence(
                rid=item.rid if n == 1 else f"{item.rid}-{i}", group_rid=item.rid,
                prompt_ids=list(ids), params=item.params, seed=seed,
                return_logprob=item.return_logprob, top_logprobs_num=item.top_logprobs_num,
                logprob_start_len=item.logprob_start_len, stream=item.stream,
                return_text_in_logprobs=item.return_text_in_logprobs))
        return seqs

    @staticmethod
    def _notifier(fut: concurrent.futures.Future, on_update: UpdateFn | None):
        def notify(out: dict, finished: bool):
            if on_update is not None:
                on_update(out, finished)
            if finished and not fut.done():
                fut.set_result(out)
        return notify

    # ================================================================ loop thread

    def _call(self, fn, *args):
        """Run fn(*args) on the engine thread between steps and return its result."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        if self._stopped:
            raise RuntimeError("engine is shut down")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("cmd", fn, args, fut))
        self._wake.set()
        return fut.result()

    def _drain_inbox(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "seq":
                self.scheduler.add(msg[1])
                continue
            _, fn, args, fut = msg
            self._complete_inflight()  # commands see every launched step processed
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _loop(self) -> None:
        try:
            while not self._stopped:
                self._iterate()
            self._complete_inflight()
        except BaseException as e:  # noqa: BLE001 - a dead engine thread must not hang callers
            log.critical("engine thread died", exc_info=e)
            self._stopped = True
            self._fail_everything(e)

    def _iterate(self) -> None:
        self._drain_inbox()
        t0, waited0 = time.perf_counter(), self._waited_s
        step = self._launch_next()
        completed = self._complete_inflight()
        if step is None:
            if not completed:
                self._wake.wait(timeout=0.05)
                self._wake.clear()
            return
        self._inflight = step
        self._after_launch(step)
        if not self.overlap:
            self._complete_inflight()
        if not step.batch.is_prefill:
            self.step_stats.add(time.perf_counter() - t0, self._waited_s - waited0)

    def _fail_everything(self, e: BaseException) -> None:
        """Answer every request and queued command with the error (the thread is gone)."""
        sch = self.scheduler
        for seq in list(sch.running) + list(sch.waiting):
            self._finish(seq, _error_reason(f"engine died: {e!r}", e))
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "seq":
                self._finish(msg[1], _error_reason(f"engine died: {e!r}", e))
            else:
                msg[3].set_exception(RuntimeError(f"engine died: {e!r}"))

    def _launch_next(self) -> PendingStep | None:
        batch = self.scheduler.schedule() if self.kv.pool.allocated else None
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
            self._finish(seq, _error_reason(f"engine error: {e}", e))

    def _process(self, batch: Batch, out: StepOutput) -> None:
        for i, seq in enumerate(batch.seqs):
            if seq.finished:  # ended at the step before (overlap) or aborted: token dropped
                continue
            if i in out.input_logprobs:
                seq.input_logprobs, seq.input_top_logprobs = out.input_logprobs[i]
            if seq.params.max_new_tokens == 0:
                self._finish(seq, {"type": "length", "length": 0})
                continue
            tok = out.token_ids[i]
            seq.output_ids.append(tok)
            if out.logprobs is not None:
                seq.output_logprobs.append(out.logprobs[i])
            if seq.top_logprobs_num:
                seq.output_top_logprobs.append(out.top_logprobs[i][:seq.top_logprobs_num])
            reason = self._check_finish(seq, tok, out.stop_hits[i])
            if reason is not None:
                self._finish(seq, reason)
            elif seq.stream:
                if not seq.params.stop:
                    self.detok.update(seq)
                seq.on_update(self._output(seq, final=False), False)

    def _check_finish(self, seq: Sequence, tok: int, is_stop_id: bool) -> dict | None:
        """`is_stop_id`: the GPU found `tok` among the request's stop ids (row_state.py)."""
        p, n = seq.params, len(seq.output_ids)
        if n >= p.max_new_tokens:
            return {"type": "length", "length": p.max_new_tokens}
        if is_stop_id and n > p.min_new_tokens:  # stop ids were masked out below min_new_tokens
            return {"type": "stop", "matched": tok}
        if seq.num_tokens >= self.max_seq_len:
            return {"type": "length", "length": n}
        if p.stop and self.tokenizer is not None:
            delta = self.detok.update(seq)
            if n >= p.min_new_tokens:
                hit = self.detok.find_stop(seq, delta)
                if hit is not None:
                    seq.stop_pos = hit[1]
                    return {"type": "stop", "matched": hit[0]}
        return None

    def _finish(self, seq: Sequence, reason: dict) -> None:
        if seq.finished:
            return
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.finished_at = time.time()
        seq.on_update(self._output(seq, final=True), True)

    def _token_text(self, seq: Sequence, tid: int):
        if not seq.return_text_in_logprobs or self.tokenizer is None:
            return None
        return self.tokenizer.decode([tid])

    def _output(self, seq: Sequence, final: bool) -> dict:
        if self.tokenizer is None:
            text = ""
        else:
            text = self.detok.final_text(seq) if final else seq.text
            if not final and seq.params.stop:
                # Hold back what could be the start of a stop string, so streamed text never
                # shows characters the final (trimmed) text drops.
                hold = max(len(s) for s in seq.params.stop) - 1
                text = text[:max(0, len(text) - hold)]
        meta = {
            "id": seq.rid,
            "finish_reason": seq.finish_reason if final else None,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "e2e_latency": (seq.finished_at or time.time()) - seq.created,
            "num_preemptions": seq.num_preemptions,
        }
        if self.compressor is not None:
            meta["compression"] = {
                "num_compressions": seq.num_compressions, "tokens_evicted": seq.tokens_evicted,
                "peak_kv_slots": max(seq.peak_kv, seq.kv_len),
                "stopped_after_think": seq.compress_stopped}
        if seq.return_logprob:
            tt = lambda t: self._token_text(seq, t)  # noqa: E731
            meta["output_token_logprobs"] = [
                [lp, t, tt(t)] for lp, t in zip(seq.output_logprobs, seq.output_ids)]
            if seq.logprob_start_len >= 0 and seq.input_logprobs is not None:
                start = seq.logprob_start_len
                meta["input_token_logprobs"] = [
                    [lp, t, tt(t)] for lp, t in zip(seq.input_logprobs, seq.prompt_ids[start:])]
            if seq.top_logprobs_num:
                meta["output_top_logprobs"] = [
                    [[lp, t, tt(t)] for lp, t in top] for top in seq.output_top_logprobs]
                if seq.input_top_logprobs is not None:
                    meta["input_top_logprobs"] = [
                        None if top is None else [[lp, t, tt(t)] for lp, t in top]
                        for top in seq.input_top_logprobs]
        return {"text": text, "output_ids": list(seq.output_ids), "meta_info": meta}

    # ================================================================ commands (engine thread)

    def _abort(self, rid: str, abort_all: bool, message: str) -> int:
        victims = [s for s in list(self.scheduler.running) + list(self.scheduler.waiting)
                   if abort_all or s.rid == rid or s.group_rid == rid]
        for seq in victims:
            self._finish(seq, {"type": "abort", "message": message, "status_code": None,
                               "err_type": None})
        return len(victims)

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            self._abort("", True, "Aborted by pause_generation")
        elif mode == "retract":
            self.scheduler.retract_all()
        self.scheduler.paused = True

    def _continue(self) -> None:
        self.scheduler.paused = False

    def _update_weights(self, make_named, weight_version, abort_all_requests) -> dict:
        if abort_all_requests:
            self._abort("", True, "Aborted for a weight update")
        n = self.runner.load_weights(make_named())
        if weight_version is not None:
            self.weight_version = str(weight_version)
        return {"success": True, "message": f"Updated {n} tensors.", "num_paused_requests": 0}

    def _weight_rows(self, name: str, rows: int) -> list:
        dst = weight_destination(self.runner.model, name)
        if dst is None:
            raise ValueError(f"{name} is not stored by this engine (tied to another weight, or a buffer)")
        return dst[:rows].tolist()

    def _release(self, tags: set[str]) -> None:
        unknown = tags - _MEMORY_TAGS
        if unknown:
            raise ValueError(f"unknown memory tag(s): {sorted(unknown)}")
        if self.scheduler.running or self.scheduler.waiting:
            raise ValueError("cannot release memory while requests are in flight")
        self.runner.release(tags)

    def _resume(self, tags: set[str]) -> None:
        unknown = tags - _MEMORY_TAGS
        if unknown:
            raise ValueError(f"unknown memory tag(s): {sorted(unknown)}")
        self.runner.resume(tags)
