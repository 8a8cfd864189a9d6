"""Conversion demo (the quickstart until the RL trainer lands): a tiny Qwen2.5-style model goes
HF -> torch_dist -> Megatron at TP=1 and TP=2 (logits vs HF) -> HF, and comes back bit-exact.

    python -m checkpoint_tools.demo [--workdir runs/quickstart]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m checkpoint_tools.demo",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="runs/quickstart", help="where the checkpoints are written")
    p.add_argument("--family", default="qwen2.5", help="tiny model family (see tiny_models)")
    args = p.parse_args(argv)
    # the converters import torch and Megatron: after the flags, so --help is immediate
    from .hf2megatron import convert_hf_to_torch_dist
    from .hf_io import read_all_tensors, same_tensors
    from .megatron2hf import convert_torch_dist_to_hf
    from .tiny_models import make_tiny_model
    from .verify import compare_with_hf

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    rows = []

    def step(name, fn):
        start = time.perf_counter()
        result = fn()
        rows.append((name, time.perf_counter() - start, result))
        print(f"  {name:<34} {rows[-1][1]:6.1f}s  {result}")
        return result

    print(f"quickstart (conversion demo) in {work}/")
    hf = step("build tiny HF model", lambda: make_tiny_model(args.family, work / "hf"))
    step("hf2megatron", lambda: convert_hf_to_torch_dist(hf, work / "torch_dist").name)
    d1 = step("Megatron TP=1 logits vs HF", lambda: f"max |diff| {compare_with_hf(hf, work / 'torch_dist'):.2e}")
    d2 = step("Megatron TP=2 logits vs HF", lambda: f"max |diff| {compare_with_hf(hf, work / 'torch_dist', tp=2):.2e}")
    back = step("megatron2hf", lambda: convert_torch_dist_to_hf(
        work / "torch_dist", work / "hf_back", origin_hf_dir=hf, progress=False))
    exact = same_tensors(read_all_tensors(hf), read_all_tensors(back))
    ok = exact and all(float(d.split()[-1]) < 1e-4 for d in (d1, d2))
    print(f"summary: round trip bit-exact={exact}; logits within 1e-4 at TP=1 and TP=2: "
          f"{'yes' if ok else 'NO'}; total {sum(r[1] for r in rows):.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
