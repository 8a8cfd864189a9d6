"""HF -> torch_dist -> HF conversion time and peak host memory (RSS) on a Qwen2.5-0.5B-shaped model.

    python -m benchmarks.training.checkpoint_convert [--dtype bfloat16] [--workdir DIR]

Builds a random model with the Qwen2.5-0.5B config (no hub), saves it with ``save_pretrained``,
then runs each converter as its own process (the CLI users run) while sampling the RSS of that
process tree; prints seconds, peak RSS and the ratio to the model's bytes, and checks the round
trip is bit-exact.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                  max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
                  rms_norm_eps=1e-6)


def build_model(out: Path, dtype: torch.dtype) -> int:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**QWEN25_05B)
    config.dtype = dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty breaks the tie; restore it so lm_head is embed_tokens
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(out)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _tree_memory(ps: psutil.Process) -> int:
    """Proportional set size of a process tree: shared pages (forked writers, mmap'd safetensors)
    are split between the processes mapping them instead of counted once per process."""
    total = 0
    for proc in [ps, *ps.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def run_measured(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak memory (PSS summed over the process tree, bytes) of a command."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_memory(ps))
        time.sleep(0.02)
    if proc.returncode:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - start, peak


def tensors_equal(a: Path, b: Path) -> bool:
    from checkpoint_tools.hf_io import read_all_tensors, same_tensors

    return same_tensors(read_all_tensors(a), read_all_tensors(b))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-convert-"))
    hf, mcore, back = work / "hf", work / "torch_dist", work / "hf_back"
    for d in (hf, mcore, back):
        shutil.rmtree(d, ignore_errors=True)

    model_bytes = build_model(hf, getattr(torch, args.dtype))
    py = sys.executable
    t1, rss1 = run_measured([py, "-W", "ignore", "-m", "checkpoint_tools.hf2megatron",
                             "--hf-checkpoint", str(hf), "--save", str(mcore)])
    t2, rss2 = run_measured([py, "-W", "ignore", "-m", "checkpoint_tools.megatron2hf",
                             "--load", str(mcore), "--output-dir", str(back),
                             "--origin-hf-dir", str(hf)])
    exact = tensors_equal(hf, back)
    gib = 1024**3
    print(f"\nQwen2.5-0.5B shape, {args.dtype}, model {model_bytes / gib:.2f} GiB, "
          f"{psutil.cpu_count()} CPUs")
    print(f"{'direction':<22}{'seconds':>9}{'peak RSS GiB':>14}{'RSS / model':>13}")
    print(f"{'HF -> torch_dist':<22}{t1:>9.1f}{rss1 / gib:>14.2f}{rss1 / model_bytes:>13.2f}")
    print(f"{'torch_dist -> HF':<22}{t2:>9.1f}{rss2 / gib:>14.2f}{rss2 / model_bytes:>13.2f}")
    print(f"round trip bit-exact: {exact}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
