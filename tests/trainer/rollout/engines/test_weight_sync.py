"""WeightSync transports against a server process: after a push the engine holds exactly the
pushed tensors (bit for bit, read back through /get_weights_by_name) and reports the version; a
restarted engine is brought to the last pushed weights (resync), and the next push reaches it."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import pytest
import requests
import torch

from sglang_kvc.weights.loader import iter_safetensors
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.engines.weight_sync import WeightSync

SERVER = ["--device", "cpu", "--max-total-tokens", "2048", "--log-level", "warning"]


@pytest.fixture(scope="module")
def models(tiny_model_factory):
    """(the checkpoint the server starts from, other weights of the same shapes)"""
    return tiny_model_factory("qwen2.5"), tiny_model_factory("qwen2.5", seed=1)


@pytest.fixture(scope="module")
def fleet(models, tmp_path_factory):
    cfg = FleetConfig(str(models[0]), 1, SERVER, start_timeout=120, max_restarts=10,
                      log_dir=str(tmp_path_factory.mktemp("fleet")))
    with EngineFleet(cfg) as f:
        yield f


def served(url: str, name: str, like: torch.Tensor) -> torch.Tensor:
    r = requests.post(url + "/get_weights_by_name", json={"name": name, "truncate_size": 1 << 30},
                      timeout=30)
    assert r.status_code == 200, r.text
    return torch.tensor(r.json(), dtype=like.dtype)


def assert_serves(url: str, checkpoint: Path, version: str) -> None:
    for name, expected in iter_safetensors(checkpoint):
        assert torch.equal(served(url, name, expected), expected), name
    got = requests.get(url + "/get_weight_version", timeout=10).json()["weight_version"]
    assert got == version


def _torch_shm_files() -> list[Path]:
    return list(Path("/dev/shm").glob(f"torch_{os.getpid()}_*"))


@pytest.mark.parametrize("mode", ["tensor", "ipc", "disk", "distributed"])
def test_push_resync_after_restart_push_again(mode, fleet, models, tmp_path):
    start, other = models
    url = fleet.urls[0]
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    # 64 KiB buckets: the tiny model travels in several requests / broadcasts
    sync = WeightSync(mode, engines=http, bucket_bytes=64 << 10, disk_dir=tmp_path,
                      hf_config_dir=start)
    fleet.resync = sync.resync
    stats = sync.push_tensors(lambda: iter_safetensors(other), f"{mode}-1")
    assert stats["sync_bytes"] == sum(t.numel() * t.element_size() for _, t in iter_safetensors(other))
    assert_serves(url, other, f"{mode}-1")
    if mode == "ipc":
        gc.collect()
        assert _torch_shm_files() == []  # the server let go of every bucket; the files are gone

    engine = fleet.engines[0]
    os.kill(engine.proc.pid, signal.SIGKILL)
    engine.proc.wait()
    assert fleet.restart(url) == url  # a new process, which starts from `start` ...
    assert_serves(url, other, f"{mode}-1")  # ... and was given the last pushed weights

    sync.push_tensors(lambda: iter_safetensors(start), f"{mode}-2")
    assert_serves(url, start, f"{mode}-2")


def test_nothing_pushed_yet_resync_keeps_the_checkpoint(fleet, models, tmp_path):
    sync = WeightSync("tensor", engines=HTTPRollout(fleet.urls), disk_dir=tmp_path)
    before = requests.get(fleet.urls[0] + "/get_weight_version", timeout=10).json()
    sync.resync(fleet.urls[0])  # no version yet: the engine keeps what it started from
    assert requests.get(fleet.urls[0] + "/get_weight_version", timeout=10).json() == before


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="--weight-sync must be one of"):
        WeightSync("cuda-ipc", engines=object())


@pytest.mark.parametrize("mode", ["tensor", "disk"])
def test_engine_killed_during_a_push_is_restarted_resynced_and_used_again(mode, fleet, models,
                                                                         tmp_path):
    """The engine dies as the push's first update request reaches it: the push still ends, the
    restart hook replaces the engine, which then serves the pushed weights and version, and the
    next push reaches it."""
    start, other = models
    url, engine = fleet.urls[0], fleet.engines[0]
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    sync = WeightSync(mode, engines=http, bucket_bytes=64 << 10, disk_dir=tmp_path,
                      hf_config_dir=start)
    fleet.resync = sync.resync
    post, killed = http.post, []

    def dying_post(target, payload, retries=1):
        if "/update_weights" in target and not killed:
            killed.append(engine.proc.pid)
            os.kill(engine.proc.pid, signal.SIGKILL)
            engine.proc.wait()
        return post(target, payload, retries)

    http.post = dying_post
    stats = sync.push_tensors(lambda: iter_safetensors(other), f"{mode}-lost-1")
    assert killed and stats["sync_engines_lost"] == 1.0
    assert http.engines.counts.engine_failures == 1 and http.engines.counts.engine_restarts == 1
    assert engine.proc.pid != killed[0] and http.urls == [url]
    assert_serves(url, other, f"{mode}-lost-1")
    stats = sync.push_tensors(lambda: iter_safetensors(start), f"{mode}-lost-2")
    assert stats["sync_engines_lost"] == 0.0
    assert_serves(url, start, f"{mode}-lost-2")
