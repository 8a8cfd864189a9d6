"""Where an FP8 KV pool's sampler/trainer gap comes from (issue 53), on a CPU.

    python -m benchmarks.engine.fp8_quality --shape qwen2.5-0.5b            # random weights, ~10 min
    python -m benchmarks.engine.fp8_quality --model-dir models/SmolLM2-135M-Instruct
    python -m benchmarks.engine.fp8_quality --smoke                         # tiny shape, seconds

Per KV configuration (``auto``: the model dtype; ``fp8_e4m3`` / ``fp8_e5m2`` with scales 1.0,
and with scales calibrated from the prompts' K/V amax: ``@amax``), the engine samples
``--prompts`` responses at T = 1 (``--dtype``, fp32 by default) and the sampled tokens'
log-probs are compared with two fp32 references that share no code with the engine:

- ``dense``: Hugging Face's fp32 forward over prompt + response (the trainer's π_old): k3, KL,
  mean and max |Δ log p| of the engine against it, as the trainer's mismatch metrics count them.
- ``emulated``: the same forward with FP8 applied where the engine applies it (fp8_emulation.py:
  K/V read by response positions quantize -> dequantize; prompt positions attend to raw K/V,
  as the engine's prefill does). The engine against it isolates the engine's own paths (a bug
  shows here); it against ``dense`` is FP8's rounding alone.

Also per layer: the K (after RoPE) and V amax over the prompts, the share of values below the
format's smallest normal or above its largest finite value at scale 1, and the relative error of
a pure quantize -> dequantize round trip at scale 1 and at the calibrated scale (written as
``scales_<dtype>.json`` in ``--workdir``: an ``--quantization-param-path`` file). ``--perturb``
adds rows where the emulation rounds K/V to bf16 only, or adds noise of e4m3's size: how
sensitive the model itself is to a perturbation of the stored K/V, whatever its source.

Internals timed: none (it measures error, not time); it reads the per-layer scales file with the
engine's own ``sglang_kvc.kvcache.kv_quant.load_scales``, so the emulation uses the very scales
the engine applies.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.engine.fp8_emulation import KVEmulation, layer_stats
from benchmarks.engine.throughput import UNFILTERED

CHAT = ["Explain why the sky is blue.", "Write a short poem about autumn leaves.",
        "What is 17 times 23? Show your steps.", "Give three tips for learning to cook.",
        "Describe how a bicycle works.", "Summarize the plot of a heist movie you invent.",
        "Why do cats purr?", "List the planets of the solar system with one fact each."]


def build_model(args, work: Path) -> Path:
    """The real checkpoint, or a random one of ``--shape`` (fp32; ``--init-std``: the weights'
    std, the tiny families' 0.1 unless given)."""
    if args.model_dir:
        return Path(args.model_dir)
    from benchmarks.common.checkpoint import shape_spec
    from checkpoint_tools.tiny_models import make_tiny_model

    family, overrides = shape_spec(args.shape)
    if args.init_std is not None:
        overrides = {**overrides, "initializer_range": args.init_std}
    return make_tiny_model(family, work / "hf", dtype=torch.float32, overrides=overrides)


def make_prompts(args, path: Path) -> list[list[int]]:
    """Chat prompts for a model with a chat template, else random ids of ``--prompt-len``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if args.model_dir:
        return [tok.apply_chat_template([{"role": "user", "content": CHAT[i % len(CHAT)]}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
                for i in range(args.prompts)]
    g = torch.Generator().manual_seed(args.seed)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return [torch.randint(10, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]


def sample(path: Path, prompts, kv_dtype: str, scales: Path | None, args):
    """The engine's T = 1 samples and their log-probs (one request per prompt, no prefix cache)."""
    from sglang_kvc import Engine

    kw = {"quantization_param_path": str(scales)} if scales else {}
    engine = Engine(model_path=str(path), device=args.device, dtype=args.dtype, kv_cache_dtype=kv_dtype,
                    skip_tokenizer_init=True, disable_radix_cache=True, random_seed=args.seed,
                    max_total_tokens=len(prompts) * (max(map(len, prompts)) + args.response_len + 8), **kw)
    sp = [{"max_new_tokens": args.response_len, "temperature": 1.0, "ignore_eos": True,
           "sampling_seed": args.seed + i, **UNFILTERED} for i in range(len(prompts))]
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=sp, return_logprob=True)
    finally:
        engine.shutdown()
    return ([o["output_ids"] for o in outs],
            [torch.tensor([e[0] for e in o["meta_info"]["output_token_logprobs"]]) for o in outs])


def reference_logprobs(model, emu: KVEmulation, prompts, responses) -> list[torch.Tensor]:
    """Each response's token log-probs under the HF model with `emu`'s KV treatment."""
    out = []
    for p, r in zip(prompts, responses):
        ids = torch.tensor([p + r], device=model.device)
        with torch.no_grad(), emu.active(len(p)):
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()
        out.append(torch.log_softmax(logits, -1).gather(1, ids[0, len(p):, None])[:, 0].cpu())
    return out


def gap(ref: list[torch.Tensor], lp: list[torch.Tensor]) -> dict:
    """The trainer's mismatch metrics of `ref` (π_old) against `lp` (the sampler), plus |Δ|."""
    from trainer.algorithms import mismatch_metrics

    old, roll = torch.nn.utils.rnn.pad_sequence(ref, True), torch.nn.utils.rnn.pad_sequence(lp, True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(x)) for x in ref], True) > 0
    m = mismatch_metrics(old, roll, mask)
    d = (old - roll)[mask].abs()
    return {"k3": float(m["k3_kl"]), "kl": float(m["kl"]), "mean_abs": float(d.mean()),
            "max_abs": float(d.max())}


def calibrate(model, prompts, kv_dtype: str, work: Path) -> tuple[Path, list[dict]]:
    """Per-layer stats of the prompts' K/V and a scales JSON (SGLang's form) of K/V amax over
    the format's largest value (one scale per layer for K and V: the larger of the two)."""
    emu = KVEmulation(model, mode="record")
    reference_logprobs(model, emu, prompts, [[0] for _ in prompts])
    stats = layer_stats(emu.recorded, kv_dtype)
    path = work / f"scales_{kv_dtype}.json"
    table = {str(i): s["scale_amax"] for i, s in enumerate(stats)}
    path.write_text(json.dumps({"kv_cache": {"dtype": kv_dtype, "scaling_factor": {"0": table}}}))
    return path, stats


def run_config(spec: str, ctx: dict, args) -> dict:
    """One KV configuration: ``auto``, ``fp8_e4m3``, ``fp8_e4m3@amax`` ..."""
    kv_dtype, _, how = spec.partition("@")
    scales = ctx["scales"][kv_dtype] if how == "amax" else None
    ids, lp = sample(ctx["path"], ctx["prompts"], kv_dtype, scales, args)
    dense = reference_logprobs(ctx["model"], ctx["dense"], ctx["prompts"], ids)
    row = {"config": spec, "tokens": sum(map(len, ids)), "vs_dense": gap(dense, lp)}
    if kv_dtype != "auto":
        emu = KVEmulation(ctx["model"], mode=kv_dtype, scales=ctx["layer_scales"](scales))
        emulated = reference_logprobs(ctx["model"], emu, ctx["prompts"], ids)
        row["vs_emulated"] = gap(emulated, lp)
        row["emulated_vs_dense"] = gap(dense, emulated)
    print(json.dumps(row), flush=True)
    return {**row, "_ids": ids}


def perturb_rows(ids, ctx: dict, args) -> list[dict]:
    """How far the model's log-probs move when only the stored K/V are perturbed: bf16
    rounding, and e4m3-sized noise (half a step at each value's binade, no quantization). The
    tokens are the dense engine's samples, so the dense model is the sampler here (k3 estimates
    KL(dense || perturbed) as the FP8 rows estimate KL(FP8 || dense))."""
    dense = reference_logprobs(ctx["model"], ctx["dense"], ctx["prompts"], ids)
    rows = []
    for mode in ("bfloat16", "noise"):
        emu = KVEmulation(ctx["model"], mode=mode, seed=args.seed)
        perturbed = reference_logprobs(ctx["model"], emu, ctx["prompts"], ids)
        rows.append({"config": f"perturb:{mode}", "perturbed_vs_dense": gap(perturbed, dense)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="training/rl_step.py's --shape (random weights)")
    p.add_argument("--model-dir", default=None, help="a real HF checkpoint instead (chat prompts)")
    p.add_argument("--init-std", type=float, default=None, help="random weights' std (default 0.1)")
    p.add_argument("--configs", nargs="+", default=["auto", "fp8_e4m3", "fp8_e4m3@amax", "fp8_e5m2"])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64, help="random-weight prompts' length")
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--perturb", action="store_true", help="add the bf16 / noise sensitivity rows")
    p.add_argument("--device", default="cpu", help="the engine's and the references' device")
    p.add_argument("--dtype", default="float32", help="the engine's model dtype (references: fp32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny shape, 2 short samples")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.model_dir, args.prompts, args.prompt_len, args.response_len = "tiny", None, 2, 16, 24
    return args


def main(argv=None) -> dict:
    from transformers import AutoModelForCausalLM

    from benchmarks.common.report import emit
    from sglang_kvc.kvcache.kv_quant import load_scales

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fp8-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    path = build_model(args, work)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    prompts = make_prompts(args, path)
    fp8 = sorted({c.partition("@")[0] for c in args.configs} - {"auto"})
    calibrated = {d: calibrate(model, prompts, d, work) for d in fp8}
    n_layers = model.config.num_hidden_layers
    ctx = {"path": path, "model": model, "prompts": prompts, "dense": KVEmulation(model, mode="none"),
           "scales": {d: s for d, (s, _) in calibrated.items()},
           "layer_scales": lambda s: load_scales(str(s) if s else None, n_layers)}
    for d, (_, stats) in calibrated.items():
        print(json.dumps({"layer_stats": d, "layers": stats}), flush=True)
    rows = [run_config(c, ctx, args) for c in args.configs]
    if args.perturb:
        rows += perturb_rows(rows[0]["_ids"], ctx, args)
    for r in rows:
        r.pop("_ids", None)
    return emit({"model": args.model_dir or args.shape, "init_std": args.init_std,
                 "device": args.device, "dtype": args.dtype,
                 "prompts": args.prompts,
                 "prompt_lens": [len(p) for p in prompts], "response_len": args.response_len,
                 "layer_stats": {d: s for d, (_, s) in calibrated.items()}, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
