"""Decode throughput of the sglang_kvc engine vs HF `generate`, same model, same run.

Qwen2.5-0.5B shape with random weights (no hub access needed), batch 256, prompt 128 random
token ids, 512 output tokens with ignore_eos, greedy for both. Reports output tok/s, peak GPU
memory, and the ratio to the HBM roofline of reference/engine.md §6:
    step bytes = W + B * S_mean * k,  W = all weights (tied embedding read once as the LM head),
    k = 2 * layers * kv_heads * head_dim * 2 bytes,  S_mean = prompt + output / 2,
    roofline tok/s = B / (step bytes / HBM bandwidth).

    PYTHONPATH=sglang-kvc:. python benchmarks/bench_engine.py [--skip-hf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

# HBM bandwidth by GPU name (datasheet, bytes/s): engine.md §6 uses 3.35 TB/s for the H100 SXM.
HBM_BW = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def qwen25_05b_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                       tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645)


def build_checkpoint(out_dir: str, seed: int) -> int:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = qwen25_05b_config()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def bench_hf(path: str, prompts: torch.Tensor, out_len: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = prompts.cuda()
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)  # no EOS: ignore_eos
    model.generate(ids[:8], attention_mask=torch.ones_like(ids[:8]), max_new_tokens=8, **kw)  # warm up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    res = {"tok_s": n / dt, "seconds": dt, "tokens": n,
           "peak_gb": torch.cuda.max_memory_allocated() / 1e9}
    del model, out
    torch.cuda.empty_cache()
    return res


def instrument(engine) -> dict:
    """Wrap the step's stages with synchronised timers (slows the run; for breakdowns only)."""
    totals: dict[str, float] = {}

    def wrap(obj, name, label):
        fn = getattr(obj, name)

        def timed(*a, **kw):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **kw)
            torch.cuda.synchronize()
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - t
            return out
        setattr(obj, name, timed)

    r = engine.runner
    wrap(engine.scheduler, "schedule", "schedule")
    wrap(r, "prepare_decode", "prepare_decode")
    wrap(r, "_decode", "decode (incl. prepare)")
    wrap(r, "_prefill", "prefill")
    wrap(r, "_sampling_batch", "sampling_batch")
    wrap(r, "sampler", "sampler")
    wrap(r, "run", "runner.run (incl. tolist)")
    wrap(engine, "_process", "process outputs")
    return totals


def bench_engine(path: str, prompts: torch.Tensor, out_len: int, args) -> dict:
    from sglang_kvc.engine import Engine

    B, P = prompts.shape
    torch.cuda.reset_peak_memory_stats()
    engine = Engine(model_path=path, skip_tokenizer_init=True, dtype="bfloat16",
                    max_total_tokens=args.pool_tokens or B * (P + out_len) + 1024,
                    max_running_requests=B, cuda_graph_max_bs=B, context_length=P + out_len + 16,
                    cuda_graph=not args.no_cuda_graph, mem_fraction_static=0.85)
    ids = prompts.tolist()
    params = {"temperature": 0.0, "max_new_tokens": out_len, "ignore_eos": True}
    engine.generate(input_ids=ids, sampling_params=dict(params, max_new_tokens=32))  # warm up/capture
    torch.cuda.synchronize()
    steps0 = engine.num_steps
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=ids, sampling_params=params)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = sum(len(o["output_ids"]) for o in outs)
    res = {"tok_s": n / dt, "seconds": dt, "tokens": n, "steps": engine.num_steps - steps0,
           "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
           "kv_pool_gb": engine.kv.pool.bytes / 1e9,
           "preemptions": engine.scheduler.num_preemptions,
           "first_ids": outs[0]["output_ids"][:16]}
    if args.breakdown:
        totals = instrument(engine)
        t0 = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params=dict(params, max_new_tokens=64))
        wall = time.perf_counter() - t0
        res["breakdown_ms_per_step"] = {k: 1e3 * v / 65 for k, v in totals.items()}
        res["breakdown_ms_per_step"]["wall"] = 1e3 * wall / 65
    engine.shutdown()
    return res


def roofline(num_params: int, B: int, P: int, O: int, gpu: str) -> dict:
    cfg = qwen25_05b_config()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    k = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    W = num_params * 2
    s_mean = P + O / 2
    bw = next((v for name, v in HBM_BW.items() if name in gpu), 3.35e12)
    step_bytes = W + B * s_mean * k
    return {"tok_s": B / (step_bytes / bw), "hbm_tb_s": bw / 1e12, "step_gb": step_bytes / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256, help="concurrent requests")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=512, help="generated tokens per request")
    ap.add_argument("--pool-tokens", type=int, default=0, help="KV pool size (0 = fits the batch)")
    ap.add_argument("--skip-hf", action="store_true", help="do not run HF generate")
    ap.add_argument("--no-cuda-graph", action="store_true", help="eager decode steps")
    ap.add_argument("--breakdown", action="store_true", help="also time each stage of a step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a GPU"
    gpu = torch.cuda.get_device_name()
    B, P, O = args.batch, args.prompt_len, args.output_len
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, 151000, (B, P), generator=g)
    with tempfile.TemporaryDirectory() as d:
        num_params = build_checkpoint(d, args.seed)
        results = {"gpu": gpu, "batch": B, "prompt_len": P, "output_len": O, "params": num_params,
                   "torch": torch.__version__}
        if not args.skip_hf:
            results["hf"] = bench_hf(d, prompts, O)
            print("HF generate:", json.dumps(results["hf"]), flush=True)
        results["engine"] = bench_engine(d, prompts, O, args)
        print("engine:", json.dumps(results["engine"]), flush=True)
    results["roofline"] = roofline(num_params, B, P, O, gpu)
    e = results["engine"]["tok_s"]
    results["roofline_fraction"] = e / results["roofline"]["tok_s"]
    if "hf" in results:
        results["speedup_vs_hf"] = e / results["hf"]["tok_s"]
    print(json.dumps(results, indent=1))
    hf = results.get("hf", {})
    print(f"| {gpu} | B={B} P={P} O={O} | engine {e:,.0f} tok/s | HF {hf.get('tok_s', float('nan')):,.0f} tok/s"
          f" | x{results.get('speedup_vs_hf', float('nan')):.2f} | peak {results['engine']['peak_gb']:.2f} GB"
          f" (HF {hf.get('peak_gb', float('nan')):.2f} GB) | roofline {100 * results['roofline_fraction']:.1f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
