"""Seconds per weight sync, trainer -> one sglang-kvc server process, per transport.

A random bf16 checkpoint of ``--shape`` (``benchmarks.common.checkpoint``: ``smollm2-135m``,
the Qwen2.5 sizes; default Qwen2.5-0.5B) is held by this process as the "trainer" (on the GPU when there is one) and
pushed through ``trainer.rollout.engines.weight_sync.WeightSync`` to a server started from the same
checkpoint on the same device, ``--pushes`` times per mode after one warm-up push (the first push
sets up the process group / CUDA IPC mappings). Each mode's last push is read back through
``/get_weights_by_name`` and compared bit for bit. Each row also splits the median push by phase
(``WeightSync.phases``: export from the trainer's tensors, flatten / serialize, the group's
set-up, the transfer with the server's load; disk: write, load).

Modes: ``tensor`` (base64 torch.save over HTTP), ``ipc`` (CUDA IPC handles on a GPU, shared
memory on CPU), ``distributed`` (one broadcast per bucket: NCCL with the server on a second GPU
when there is one; with a single GPU the two NCCL ranks cannot share it, so the bucket goes
through gloo from CPU copies and the row says so), ``disk`` (safetensors + reload), and ``auto``:
what ``--rollout-server-urls URL`` with ``--weight-sync auto`` builds (the trainer's own
``factory.weight_sync_for``), the server on a second GPU when there is one, else on the trainer's:
NCCL there, CUDA IPC here (``mode_used``; tensors over HTTP on a CPU).

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.weight_sync [--modes ipc,tensor]
        [--shape qwen2.5-0.5b|smollm2-135m|qwen2.5-3b|tiny] [--pushes 3] [--bucket-mb 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import requests
import torch

from benchmarks.common.checkpoint import SHAPES as BENCH_SHAPES, build_checkpoint
from checkpoint_tools.hf_io import read_all_tensors
from checkpoint_tools.tiny_models import SHAPES
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.weight_sync import WeightSync

MODES = ("tensor", "ipc", "distributed", "disk", "auto")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted({*SHAPES, *BENCH_SHAPES}))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--pushes", type=int, default=3, help="timed pushes per mode (after a warm-up)")
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--workdir", default=None, help="checkpoint, disk-mode files, server logs")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = sorted(set(args.modes) - set(MODES))
    if bad:
        ap.error(f"unknown mode(s) {bad}; choose from {MODES}")
    return args


def server_flags(gpu: bool) -> list[str]:
    # a small KV pool and no CUDA graphs: the server only has to start and take weights
    flags = ["--max-total-tokens", "4096", "--log-level", "warning"]
    return flags + (["--device", "cuda", "--no-cuda-graph", "--mem-fraction-static", "0.3"]
                    if gpu else ["--device", "cpu"])


def placement(mode: str, gpu: bool) -> tuple[str, dict | None]:
    """(where the trainer's tensors live, the server's extra environment) for one mode."""
    if mode not in ("distributed", "auto") or not gpu:
        return ("cuda" if gpu else "cpu"), None
    if torch.cuda.device_count() >= 2:
        return "cuda:0", {"CUDA_VISIBLE_DEVICES": "1"}  # NCCL: one GPU per rank
    if mode == "auto":
        return "cuda", None  # the server on the trainer's GPU: auto must pick IPC
    return "cpu", None  # gloo from CPU copies: NCCL cannot put both ranks on one GPU


def transport(mode: str, device: str, gpu: bool) -> str:
    if mode == "ipc":
        return "CUDA IPC" if gpu else "shared memory"
    if mode == "distributed":
        return "NCCL, server on GPU 1" if device.startswith("cuda") else (
            "gloo from CPU copies (one GPU cannot hold both NCCL ranks)" if gpu else "gloo")
    return {"tensor": "base64 torch.save over HTTP", "disk": "safetensors + reload"}[mode]


def assert_serves(url: str, named, names: list[str]) -> None:
    want = dict(named)
    for name in names:
        r = requests.post(url + "/get_weights_by_name", json={"name": name, "truncate_size": 8},
                          timeout=60)
        r.raise_for_status()
        got = torch.tensor(r.json(), dtype=want[name].dtype)
        if not torch.equal(got, want[name][:8].cpu()):
            raise AssertionError(f"{name}: the server does not hold the pushed tensor")


def auto_sync(urls: list[str], ckpt: Path, args, workdir: Path) -> WeightSync:
    """``--rollout-server-urls urls --weight-sync auto``, built as the trainer builds it."""
    from trainer.rollout.engines.config import (GROUP_TIMEOUT_S, EngineConfig,
                                                weight_sync_config_from_args)
    from trainer.rollout.engines.factory import weight_sync_for

    flags = argparse.Namespace(
        weight_sync="auto", rollout_server_urls=urls, rollout_engine_urls=None,
        rollout_num_gpus=0, rollout_engine_process=False, weight_sync_master_address=None,
        weight_sync_bucket_mb=args.bucket_mb, weight_sync_timeout=GROUP_TIMEOUT_S)
    return weight_sync_for(weight_sync_config_from_args(flags), EngineConfig(str(ckpt), {}, urls),
                           HTTPRollout(urls), workdir / "sync-auto")


def bench_mode(mode: str, fleet: EngineFleet, named, ckpt: Path, args, workdir: Path) -> dict:
    http = HTTPRollout(fleet.urls)
    sync = auto_sync(fleet.urls, ckpt, args, workdir) if mode == "auto" else WeightSync(
        mode, engines=http, bucket_bytes=args.bucket_mb << 20,
        disk_dir=workdir / f"sync-{mode}", hf_config_dir=ckpt)
    source = lambda: iter(named)  # noqa: E731 - the trainer's tensors, already in place
    first = sync.push_tensors(source, f"{mode}-warmup")["time_sync"]
    prune_disk(sync)
    times, phases = [], []
    for i in range(args.pushes):
        times.append(sync.push_tensors(source, f"{mode}-{i}")["time_sync"])
        phases.append(dict(sync.phases.seconds))
        prune_disk(sync)
    assert_serves(fleet.urls[0], named, [named[0][0], named[len(named) // 2][0], named[-1][0]])
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    median = statistics.median(times)
    return {"first_s": first, "pushes_s": times, "min_s": min(times), "median_s": median,
            "max_s": max(times), "gb_per_s": nbytes / median / 1e9, "verified": True,
            "phases_s": phases[times.index(sorted(times)[(len(times) - 1) // 2])],
            "mode_used": sync.mode}


def prune_disk(sync: WeightSync) -> None:
    """Disk mode keeps every push's directory (a restarted server is re-synced from the last):
    drop the older ones, gigabytes each at 3B."""
    last = getattr(sync.transport, "last_dir", None)
    if last is not None:
        for old in last.parent.glob("weights-*"):
            if old != last:
                shutil.rmtree(old, ignore_errors=True)


def run(args) -> dict:
    gpu = torch.cuda.is_available()
    with contextlib.ExitStack() as stack:
        workdir = Path(args.workdir or stack.enter_context(tempfile.TemporaryDirectory()))
        ckpt = workdir / f"ckpt-{args.shape}"
        if not (ckpt / "config.json").exists():
            build_checkpoint(args.shape, ckpt, dtype=getattr(torch, args.dtype))
        cpu_named = list(read_all_tensors(ckpt).items())
        nbytes = sum(t.numel() * t.element_size() for _, t in cpu_named)
        out = {"device": torch.cuda.get_device_name() if gpu else "cpu", "shape": args.shape,
               "dtype": args.dtype, "bytes": nbytes, "tensors": len(cpu_named),
               "bucket_mb": args.bucket_mb, "modes": {}}
        fleets: dict = {}
        for mode in args.modes:
            device, env = placement(mode, gpu)
            key = json.dumps(env)
            if key not in fleets:
                cfg = FleetConfig(str(ckpt), 1, server_flags(gpu), start_timeout=args.start_timeout,
                                  log_dir=str(workdir / "logs"), env=[env] if env else None)
                start = time.perf_counter()
                fleets[key] = stack.enter_context(EngineFleet(cfg))
                print(f"server up in {time.perf_counter() - start:.1f} s", flush=True)
            named = [(n, t.to(device)) for n, t in cpu_named]
            row = bench_mode(mode, fleets[key], named, ckpt, args, workdir)
            used = row["mode_used"]
            row["transport"] = (f"auto: {used}, " if mode == "auto" else "") + transport(used, device, gpu)
            out["modes"][mode] = row
            if args.json:  # after every mode: a run cut at its limit keeps the modes it measured
                Path(args.json).write_text(json.dumps(out, indent=1))
            print(f"{mode:12s} {row['transport']:60s} min {row['min_s']:.3f} s  median "
                  f"{row['median_s']:.3f} s  max {row['max_s']:.3f} s  ({row['gb_per_s']:.2f} GB/s; "
                  f"first {row['first_s']:.3f} s)", flush=True)
            print(f"{'':12s} phases of the median push: " + ", ".join(
                f"{k} {v:.3f} s" for k, v in row["phases_s"].items()), flush=True)
            del named
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
