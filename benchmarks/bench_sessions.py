"""Multi-turn rollouts with and without engine sessions (engine/sessions.py), dense and R-KV, in
one process on one GPU.

A rollout is `--samples` samples of `--turns` turns: a prompt of `--prompt-len` random ids, then
each turn generates `--turn-tokens` tokens (ignore_eos) and gets an observation of
`--obs-tokens` random ids (a tool's output and the next turn's header), all samples of a turn
in one batched call, on random weights of the 0.5B shape (bench_engine.py). Two ways per config:

    session     each sample in its own session: a turn sends its observation only and
                continues the KV the previous turn left
    reprefill   each turn is a fresh request over the whole context so far (what a loop
                without sessions does; the prefix cache still serves the first prompt)

Reported per (config, way): prefill_tokens (tokens the prefills computed), pool_peak (most slots
held at once, parked sessions' included), preemptions, rollout_s (wall seconds of all turns),
turn_s (per turn), and, dense, token_match (share of the samples whose every turn's tokens equal
the other way's: 1.0 in fp32; bf16 may differ in the last bits and then in a token).

    PYTHONPATH=sglang-kvc:. python benchmarks/bench_sessions.py --json runs/sessions.json
    PYTHONPATH=sglang-kvc:. python benchmarks/bench_sessions.py --smoke   # CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_engine import build_checkpoint  # noqa: E402  (same random model)

CONFIGS = ("dense", "rkv")
WAYS = ("session", "reprefill")


def random_ids(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (count, length), generator=g).tolist()


def engine_kwargs(config: str, args) -> dict:
    kw = dict(max_total_tokens=args.pool_tokens, skip_tokenizer_init=True, random_seed=args.seed,
              max_running_requests=args.max_running, device=args.device, dtype=args.dtype,
              context_length=args.prompt_len + args.turns * (args.turn_tokens + args.obs_tokens) + 16)
    if config == "rkv":
        kw.update(compress_algorithm="rkv", compress_max_prompt=args.budget,
                  compress_divide_length=args.divide_length, compress_keep_prompt=True)
    return kw


def rollout(engine, way: str, prompts, observations, args) -> dict:
    """All turns of every sample; returns the counters and each sample's outputs per turn."""
    sch, runner = engine.scheduler, engine.runner
    sch.num_preemptions, engine.kv.allocator.peak_used, runner.prefill_tokens = 0, 0, 0
    engine.flush_cache()
    n = len(prompts)
    contexts = [list(p) for p in prompts]
    sids = [engine.open_session() for _ in range(n)] if way == "session" else None
    prev, outputs, turn_s = [None] * n, [[] for _ in range(n)], []
    t0 = time.perf_counter()
    for turn in range(args.turns):
        new = prompts if turn == 0 else [obs[turn - 1] for obs in observations]
        params = [{"max_new_tokens": args.turn_tokens, "ignore_eos": True, "temperature": 0.0}] * n
        t = time.perf_counter()
        if way == "session":
            outs = engine.generate(input_ids=new, sampling_params=params, session_params=[
                {"id": s, "rid": r} for s, r in zip(sids, prev)])
            prev = [o["meta_info"]["id"] for o in outs]
        else:
            if turn:
                contexts = [c + o for c, o in zip(contexts, new)]
            outs = engine.generate(input_ids=contexts, sampling_params=params)
        turn_s.append(time.perf_counter() - t)
        for i, o in enumerate(outs):
            outputs[i].append(o["output_ids"])
            contexts[i] = contexts[i] + o["output_ids"]
    seconds = time.perf_counter() - t0
    peak = engine.kv.allocator.peak_used
    for s in sids or []:
        engine.close_session(s)
    return {"prefill_tokens": runner.prefill_tokens, "pool_peak": peak,
            "preemptions": sch.num_preemptions, "rollout_s": seconds, "turn_s": turn_s,
            "outputs": outputs}


def run(path: str, config: str, prompts, observations, args) -> dict:
    from sglang_kvc import Engine

    engine = Engine(model_path=path, **engine_kwargs(config, args))
    try:
        engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 8})  # warm-up
        return {way: rollout(engine, way, prompts, observations, args) for way in WAYS}
    finally:
        engine.shutdown()


def rows_of(config: str, runs: dict) -> list[dict]:
    a, b = (runs[w]["outputs"] for w in WAYS)
    match = sum(x == y for x, y in zip(a, b)) / len(a)
    rows = []
    for way in WAYS:
        r = {k: v for k, v in runs[way].items() if k != "outputs"}
        rows.append({"config": config, "way": way, **r,
                     "token_match": match if config == "dense" else None})
        print(f"{config:6s} {way:9s} prefill {r['prefill_tokens']:8d}  peak {r['pool_peak']:7d}  "
              f"preempt {r['preemptions']:3d}  {r['rollout_s']:7.2f} s  "
              f"turns {' '.join(f'{t:.2f}' for t in r['turn_s'])}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--turn-tokens", type=int, default=256)
    p.add_argument("--obs-tokens", type=int, default=128)
    p.add_argument("--pool-tokens", type=int, default=200000)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--divide-length", type=int, default=64)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--json", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU, fp32, seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.device, args.dtype, args.samples, args.turns = "tiny", "cpu", "float32", 3, 3
        args.prompt_len, args.turn_tokens, args.obs_tokens = 20, 12, 6
        args.pool_tokens, args.budget, args.divide_length = 2000, 10, 4
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(tmp, args.seed, args.shape)
        vocab = json.loads((Path(tmp) / "config.json").read_text())["vocab_size"]
        prompts = random_ids(args.samples, args.prompt_len, vocab, args.seed)
        observations = [random_ids(args.turns - 1, args.obs_tokens, vocab, args.seed + 1 + i)
                        for i in range(args.samples)]
        rows = [r for c in args.configs for r in rows_of(c, run(tmp, c, prompts, observations, args))]
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
