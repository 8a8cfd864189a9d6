"""FP8 KV against R-KV at the same KV memory (issue 53): dense bf16, dense FP8, R-KV bf16 and
R-KV FP8 rollouts of one long-tailed batch, one after another in one process on one GPU.

    python -m benchmarks.engine.fp8_kv --response-len 4096 --dense-fraction 0.1 \\
        --json runs/fp8_kv.json                       # ~4 min on one H100
    python -m benchmarks.engine.fp8_kv --smoke         # tiny shape on a CPU, seconds

The batch and lengths are studies/long_rollout.py's (``--shape`` random checkpoint, ``--prompts`` x
``--samples`` samples, log-normal lengths from ``common/long_tail.py``, T = 1 with log-probs); the KV
pool has the same bytes in every configuration: ``--dense-fraction`` of the batch's bf16 KV at
the cap, so an FP8 pool has twice the slots. Per configuration: rollout tokens/s, the samples
the pool holds at once (its slots over a sample's peak slots, as the trainer's startup line
counts them) and the most the engine ran at once, preemptions, and the sampler-vs-trainer
mismatch: a dense bf16 engine recomputes every sampled token's log-prob (its prefill over prompt
+ response: what the trainer's π_old recompute computes) and the trainer's ``mismatch_metrics``
give k3, KL and chi2 between the two (token-level ESS of the ratios too). RL step times come
from ``studies/long_rollout.py --configs dense dense@fp8_e4m3 rkv:512 rkv:512@fp8_e4m3``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.long_tail import LongTailLengths
from benchmarks.common.report import emit
from benchmarks.engine.throughput import UNFILTERED
from trainer.learner.speed import device_name

PROMPT_LEN = 64


def parse_config(spec: str) -> dict:
    """``dense`` or ``rkv:BUDGET[:DIVIDE]``, optionally ``@fp8_e4m3`` / ``@fp8_e5m2``."""
    base, _, kv = spec.partition("@")
    if kv not in ("", "fp8_e4m3", "fp8_e5m2"):
        raise SystemExit(f"--configs {spec!r}: the KV dtype after @ is fp8_e4m3 or fp8_e5m2")
    cfg = {"name": spec, "kv_dtype": kv or "auto", "compress": None}
    if base == "dense":
        return cfg
    parts = base.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("rkv", "snapkv", "streamingllm"):
        raise SystemExit(f"--configs {spec!r}: expected dense or rkv|snapkv|streamingllm:BUDGET[:DIVIDE]")
    budget = int(parts[1])
    divide = int(parts[2]) if len(parts) == 3 else max(16, budget // 4)
    return {**cfg, "compress": parts[0], "budget": budget, "divide": divide}


def bf16_pool_slots(args) -> int:
    """Slots of the model-dtype pool (bf16 on a GPU; the smoke run's fp32 on a CPU)."""
    return int(args.dense_fraction * args.prompts * args.samples * (args.response_len + PROMPT_LEN))


def engine_kwargs(args, cfg: dict) -> dict:
    """The engine of one configuration: the same pool bytes (FP8: 1 byte per element, so twice
    the slots of a bf16 pool)."""
    fp8 = cfg["kv_dtype"] != "auto"
    kw = dict(kv_cache_dtype=cfg["kv_dtype"],
              max_total_tokens=bf16_pool_slots(args) * (args.model_bytes if fp8 else 1),
              max_running_requests=args.prompts * args.samples, random_seed=args.seed,
              device=args.device, skip_tokenizer_init=True)
    if cfg["compress"]:
        kw.update(compress_algorithm=cfg["compress"], compress_max_prompt=cfg["budget"],
                  compress_divide_length=cfg["divide"], compress_max_window=8)
    return kw


def batch(args) -> tuple[list[list[int]], list[int], list[int]]:
    """Prompts (random ids), the measured rollout's lengths and the warm-up's."""
    g = torch.Generator().manual_seed(args.seed)
    n = args.prompts * args.samples
    prompts = [torch.randint(10, args.vocab, (PROMPT_LEN,), generator=g).tolist()
               for _ in range(args.prompts)]
    tail = LongTailLengths(args.response_len, args.median_frac, args.sigma, seed=args.seed)
    tail.rollouts = 1  # not the (scaled) warm-up draw
    warm = [max(1, args.response_len // 8)] * min(n, args.warmup_samples)
    return [prompts[i // args.samples] for i in range(n)], tail.lengths(n), warm


def rollout(engine, prompts, lengths, temperature: float, seed: int):
    sp = [{"max_new_tokens": m, "temperature": temperature, "ignore_eos": True,
           "sampling_seed": seed + i, **UNFILTERED} for i, m in enumerate(lengths)]
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=sp, return_logprob=True)
    seconds = time.perf_counter() - start
    ids = [o["output_ids"] for o in outs]
    logps = [[e[0] for e in o["meta_info"]["output_token_logprobs"]] for o in outs]
    return ids, logps, seconds


def samples_held(cfg: dict, pool_slots: int, response_len: int) -> int:
    """The pool's slots over a sample's peak slots (trainer/rollout/engines/capacity.py's count)."""
    from trainer.rollout.engines.capacity import samples_that_fit

    return samples_that_fit(pool_slots, PROMPT_LEN, response_len, cfg.get("budget"), cfg.get("divide"))


def run_config(args, cfg: dict, hf: Path, prompts, lengths, warm) -> dict:
    from sglang_kvc import Engine

    engine = Engine(model_path=str(hf), **engine_kwargs(args, cfg))
    try:
        rollout(engine, prompts[:len(warm)], warm, args.temperature, args.seed)  # compile, capture
        ids, logps, seconds = rollout(engine, prompts, lengths, args.temperature, args.seed)
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    pool = info["kv_pool"]
    tokens = sum(map(len, ids))
    return {"config": cfg["name"], "kv_dtype": cfg["kv_dtype"], "rollout_s": seconds,
            "rollout_tokens": tokens, "rollout_tokens_per_s": tokens / seconds,
            "pool_slots": pool["capacity"], "pool_gib": pool["bytes"] / 2**30,
            "bytes_per_token": pool["bytes_per_slot"], "pool_peak_slots": pool["peak_used"],
            "samples_held": samples_held(cfg, pool["capacity"], args.response_len),
            "max_running_seen": info["max_running_reqs_seen"],
            "preemptions": info["num_preemptions"], "_ids": ids, "_logps": logps}


def recompute_engine(args, hf: Path):
    """A dense engine in the model dtype whose prefill recomputes sampled tokens' log-probs."""
    from sglang_kvc import Engine

    return Engine(model_path=str(hf), device=args.device, skip_tokenizer_init=True,
                  max_total_tokens=args.recompute_slots, max_running_requests=args.recompute_batch)


def recompute(args, engine, prompts, ids) -> list[list[float]]:
    """Log-probs of the sampled tokens under the dense engine (the trainer's π_old side)."""
    out = []
    for i in range(0, len(ids), args.recompute_batch):
        chunk = range(i, min(i + args.recompute_batch, len(ids)))
        res = engine.generate(
            input_ids=[prompts[j] + ids[j] for j in chunk], return_logprob=True,
            logprob_start_len=PROMPT_LEN,
            sampling_params={"max_new_tokens": 0, "temperature": args.temperature})
        out += [[e[0] for e in r["meta_info"]["input_token_logprobs"]] for r in res]
    return out


def mismatch(old: list[list[float]], rollout_lp: list[list[float]]) -> dict:
    """The trainer's mismatch metrics (k3, KL, chi2) of π_old (dense recompute) against the
    sampler, and the token-level ESS of the ratios π_old / π_sampler."""
    from trainer.algorithms import mismatch_metrics

    width = max(map(len, old))
    pad = lambda rows: torch.tensor([r + [0.0] * (width - len(r)) for r in rows])  # noqa: E731
    mask = pad([[1.0] * len(r) for r in old]) > 0
    o, r = pad(old), pad(rollout_lp)
    m = {k: float(v) for k, v in mismatch_metrics(o, r, mask).items()}
    w = torch.exp((o - r)[mask].clamp(-20, 20))
    m["ess_token"] = float(w.sum() ** 2 / (w.numel() * (w ** 2).sum()))
    m["logprob_abs_diff_max"] = float((o - r)[mask].abs().max())
    return m


COLUMNS = (("config", "config"), ("rollout_s", "rollout s"), ("rollout_tokens_per_s", "tok/s"),
           ("pool_gib", "pool GiB"), ("pool_slots", "slots"), ("samples_held", "holds"),
           ("max_running_seen", "ran at once"), ("preemptions", "preempted"), ("k3_kl", "k3"),
           ("kl", "kl"), ("chi2_token", "chi2 token"), ("ess_token", "ESS token"))


def print_rows(rows: list[dict]) -> None:
    print(" ".join(f"{label:>14s}" for _, label in COLUMNS))
    for r in rows:
        print(" ".join(f"{r.get(c):>14.4g}" if isinstance(r.get(c), (int, float)) else
                       f"{str(r.get(c)):>14s}" for c, _ in COLUMNS))


def against_bf16(rows: list[dict]) -> None:
    """Each FP8 row's samples held and rollout speed over the same config's bf16 row."""
    bf16 = {r["config"]: r for r in rows if r["kv_dtype"] == "auto"}
    for r in rows:
        ref = bf16.get(r["config"].split("@")[0])
        if r["kv_dtype"] != "auto" and ref:
            r["held_vs_bf16"] = r["samples_held"] / max(ref["samples_held"], 1)
            r["rollout_speedup_vs_bf16"] = ref["rollout_s"] / r["rollout_s"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="training/rl_step.py's --shape")
    p.add_argument("--response-len", type=int, default=4096)
    p.add_argument("--configs", nargs="+", default=["dense", "dense@fp8_e4m3", "rkv:512", "rkv:512@fp8_e4m3"])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--dense-fraction", type=float, default=0.1,
                   help="the pool's bytes: this fraction of the batch's bf16 KV at the cap")
    p.add_argument("--median-frac", type=float, default=0.5)
    p.add_argument("--sigma", type=float, default=0.6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--warmup-samples", type=int, default=16, help="short warm-up rollout's samples")
    p.add_argument("--recompute-batch", type=int, default=16)
    p.add_argument("--recompute-slots", type=int, default=None, help="the recompute engine's pool")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny shape, CPU, a few short samples")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.device, args.response_len = "tiny", "cpu", 48
        args.prompts, args.samples, args.warmup_samples, args.recompute_batch = 2, 3, 2, 6
        args.dense_fraction = 0.5
        args.configs = [c.replace(":512", ":16:8") for c in args.configs]
    args.recompute_slots = args.recompute_slots or args.recompute_batch * (args.response_len + PROMPT_LEN)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    configs = [parse_config(c) for c in args.configs]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-fp8-kv-"))
    hf = build_checkpoint(args.shape, work / "hf")
    hf_cfg = json.loads((hf / "config.json").read_text())
    args.vocab = hf_cfg["vocab_size"]
    args.model_bytes = torch.empty((), dtype=getattr(torch, hf_cfg.get("dtype") or hf_cfg["torch_dtype"])).element_size()
    prompts, lengths, warm = batch(args)
    dense = recompute_engine(args, hf)
    rows = []
    try:
        for cfg in configs:
            r = run_config(args, cfg, hf, prompts, lengths, warm)
            r.update(mismatch(recompute(args, dense, prompts, r.pop("_ids")), r.pop("_logps")))
            rows.append(r)
            print_rows([r])
    finally:
        dense.shutdown()
    against_bf16(rows)
    print_rows(rows)
    return emit({"gpu": device_name(), "shape": args.shape, "response_len": args.response_len,
                 "prompts": args.prompts, "samples": args.samples,
                 "dense_fraction": args.dense_fraction, "temperature": args.temperature,
                 "rows": rows}, args.json)


if __name__ == "__main__":
    main()
