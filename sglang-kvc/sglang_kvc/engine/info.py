"""`/get_server_info`: the server args plus the pool, queue, compression and step counters, in
SGLang's field names where SGLang has them."""

from __future__ import annotations

from .. import __version__


def pool_info(kv) -> dict:
    """`used`: slots requests hold (shared ones once); `free` includes cached slots no request
    reads (the prefix cache gives them up on demand)."""
    used = kv.capacity - kv.num_free
    return {"capacity": kv.capacity, "used": used, "free": kv.num_free,
            "usage": used / kv.capacity, "allocated": kv.pool.allocated,
            "bytes": kv.pool.bytes, "peak_used": kv.allocator.peak_used,
            "bytes_per_slot": kv.pool.bytes // kv.pool.num_slots,
            "stable_address": getattr(kv.pool, "stable", None) is not None}


def compression_info(c) -> dict:
    return {"algorithm": c.cfg.algorithm, "budget": c.cfg.budget, "keep_prompt": c.cfg.keep_prompt,
            "pin_turns": c.cfg.pin_turns,
            "divide_length": c.cfg.divide_length, "selection": c.cfg.mode,
            "num_compressions": c.num_compressions, "tokens_evicted": c.tokens_evicted,
            "query_ring_bytes": c.ring.bytes if c.ring is not None else 0}


def gpu_uuid(device) -> str | None:
    """The GPU's UUID (None on a CPU): unlike `cuda:0`, the same in every process on the host,
    whatever CUDA_VISIBLE_DEVICES each one has."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def server_info(engine) -> dict:
    sch, runner = engine.scheduler, engine.runner
    info = engine.args.to_dict()
    info.update({
        "version": __version__,
        "max_total_num_tokens": engine.kv.capacity,
        "context_length": engine.context_length,
        "kv_pool": pool_info(engine.kv),
        "num_running_reqs": len(sch.running),
        "num_waiting_reqs": len(sch.waiting),
        "num_preemptions": sch.num_preemptions,
        "prefill_tokens": runner.prefill_tokens,
        "paused": sch.paused,
        "weight_version": engine.weight_version,
        "resolved_device": str(runner.device),
        "gpu_uuid": gpu_uuid(runner.device),  # which GPU (a trainer keeps NCCL off its own)
        "resolved_dtype": str(runner.dtype).removeprefix("torch."),
        "resolved_attention_backend": runner.backend_name,
        "max_running_reqs_seen": sch.max_running,
        "overlap_schedule": engine.overlap,
        "step_stats": engine.step_stats.to_dict(),
        "sessions": engine.sessions.stats(),
    })
    if runner.graphs is not None:
        info["cuda_graphs"] = runner.graphs.stats()
    if runner.prefill_graphs is not None:
        info["prefill_graphs"] = runner.prefill_graphs.stats()
    if engine.kv.prefix is not None:
        info["prefix_cache"] = engine.kv.prefix.stats()
    if engine.compressor is not None:
        info["compression"] = compression_info(engine.compressor)
    info["internal_states"] = [{k: info[k] for k in (
        "num_running_reqs", "num_waiting_reqs", "num_preemptions", "max_total_num_tokens")}]
    return info
