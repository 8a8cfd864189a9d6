"""Engines lost during a weight push (issue #39, item 5): a ``distributed`` push that loses an
engine between two broadcasts hands it to failover within seconds, rebuilds the group of the
survivors, re-sends to them and ends with every engine (the restarted one too) serving the pushed
weights; the next push goes through the rebuilt group. Gloo on CPU, three engine processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests
import torch

from sglang_kvc.weights.loader import iter_safetensors
from tests.trainer.rollout.engines.test_weight_sync import SERVER, assert_serves, models  # noqa: F401
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.engines.weight_sync import WeightSync

BUCKET = 64 << 10  # the tiny model travels in several broadcasts


@pytest.fixture(scope="module")
def fleet(models, tmp_path_factory):
    cfg = FleetConfig(str(models[0]), 3, SERVER, start_timeout=120, max_restarts=10,
                      log_dir=str(tmp_path_factory.mktemp("fleet3")))
    with EngineFleet(cfg) as f:
        yield f


class Killer:
    """SIGKILL ``engine`` as the push's ``after``-th request to ``path`` goes out; records when
    it did, and when failover was told."""

    def __init__(self, http: HTTPRollout, engine, path: str, after: int):
        self.engine, self.path, self.after, self.sent = engine, path, after, 0
        self.pid, self.killed_at, self.failed_at = None, None, None
        self._post, self._failed = http.post, http.engines.failed
        http.post, http.engines.failed = self.post, self.failed
        self._lock = threading.Lock()

    def post(self, target, payload, retries=1):
        with self._lock:
            if self.path in target:
                self.sent += 1
                if self.sent == self.after:
                    self.pid, self.killed_at = self.engine.proc.pid, time.monotonic()
                    os.kill(self.pid, signal.SIGKILL)
                    self.engine.proc.wait()
        return self._post(target, payload, retries)

    def failed(self, slot, url, error):
        self.failed_at = self.failed_at or time.monotonic()
        return self._failed(slot, url, error)


def test_engine_killed_mid_distributed_push(fleet, models):
    # engine 1 is rank 2 of 4: with it gone, gloo's broadcast tree leaves both survivors waiting
    kill_mid_push(fleet, models, fleet.engines[1])


def kill_mid_push(fleet, models, victim, device: str = "cpu", timeout_s: float = 30) -> None:
    """Push, kill ``victim`` as the next push's second bucket goes out, check the push went on
    (survivors re-sent through a new group, the victim restarted and re-synced), push again."""
    start, other = [lambda m=m: ((n, t.to(device)) for n, t in iter_safetensors(m))
                    for m in models]
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    # what a gloo broadcast left waiting on a survivor gives up after (sent: not the default)
    sync = WeightSync("distributed", engines=http, bucket_bytes=BUCKET, group_timeout_s=timeout_s)
    fleet.resync = sync.resync
    assert sync.push_tensors(start, "d-0")["sync_engines_lost"] == 0
    first = sync.group.generation

    killer = Killer(http, victim, "/update_weights_from_distributed", after=len(fleet.urls) + 1)
    sent, wait_for_lost = [], sync._wait_for_lost
    sync._wait_for_lost = lambda: (sent.append(time.monotonic()), wait_for_lost())[1]
    began = time.monotonic()
    stats = sync.push_tensors(other, "d-1")
    took = time.monotonic() - began
    detected, survivors = killer.failed_at - killer.killed_at, sent[0] - killer.killed_at
    print(f"\npush with a lost engine: {took:.1f} s; failover told {detected:.2f} s and the "
          f"survivors done {survivors:.2f} s after the kill (then the restart); groups built "
          f"{sync.group.generation - first}")
    assert killer.pid is not None and stats["sync_engines_lost"] == 1.0
    assert detected < 10 and took < 60
    counts = http.engines.counts
    assert (counts.engine_failures, counts.engine_restarts) == (1, 1)
    assert victim.proc.pid != killer.pid and http.urls == fleet.urls
    for url in fleet.urls:  # the survivors through the rebuilt group, the new process by resync
        assert_serves(url, models[1], "d-1")

    began = time.monotonic()
    assert sync.push_tensors(start, "d-2")["sync_engines_lost"] == 0
    print(f"next push, the group rebuilt with the new engine: {time.monotonic() - began:.1f} s")
    assert sync.group.urls == fleet.urls
    for url in fleet.urls:
        assert_serves(url, models[0], "d-2")
    if device != "cpu":  # what the abort left must not fire later (NCCL watchdog, timeouts)
        time.sleep(timeout_s + 5)
        assert all(e.proc.poll() is None for e in fleet.engines)
        assert sync.push_tensors(other, "d-3")["sync_engines_lost"] == 0
        assert http.engines.counts.engine_failures == 1


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_gpu_drill_engine_killed_mid_nccl_push(models, tmp_path):
    """The same over NCCL: the trainer's tensors on GPU 0, one engine per other GPU (NCCL wants
    a GPU per rank), up to three; with two GPUs the only engine is lost (no survivor to re-send
    to: detection, restart, re-sync, next push)."""
    n = min(3, torch.cuda.device_count() - 1)
    cfg = FleetConfig(str(models[0]), n, ["--device", "cuda", "--max-total-tokens", "4096",
                                          "--log-level", "warning"],
                      start_timeout=300, max_restarts=3, log_dir=str(tmp_path),
                      env=[{"CUDA_VISIBLE_DEVICES": str(1 + i)} for i in range(n)])
    torch.cuda.set_device(0)
    with EngineFleet(cfg) as fleet:
        kill_mid_push(fleet, models, fleet.engines[n // 2], device="cuda:0")


def test_engine_dead_before_the_group_is_built(fleet, models):
    """An engine that died unnoticed (between pushes) refuses to join the group: it is handed to
    failover and the group is built of the others, without waiting for the rendezvous."""
    start, _ = models
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    sync = WeightSync("distributed", engines=http, bucket_bytes=BUCKET, group_timeout_s=30)
    fleet.resync = sync.resync
    victim = fleet.engines[0]
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    began = time.monotonic()
    assert sync.push_tensors(lambda: iter_safetensors(start), "b-1")["sync_engines_lost"] == 1.0
    assert time.monotonic() - began < 60 and http.engines.counts.engine_restarts == 1
    for url in fleet.urls:
        assert_serves(url, start, "b-1")


def test_member_error_aborts_the_group_and_fails_the_push(fleet, models):
    """A live engine that refuses a bucket is an error, not a loss: the push fails at once, no
    engine is restarted, and the group is rebuilt for the next push."""
    start, _ = models
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    sync = WeightSync("distributed", engines=http, bucket_bytes=BUCKET)
    fleet.resync = sync.resync
    sync.push_tensors(lambda: iter_safetensors(start), "e-0")

    def wrong_shapes():  # a shape no engine accepts: every server refuses with 400
        for name, t in iter_safetensors(start):
            yield name, t[:1] if name.endswith("norm.weight") else t

    began = time.monotonic()
    with pytest.raises(RuntimeError, match="distributed weight update failed"):
        sync.push_tensors(wrong_shapes, "e-bad")
    assert time.monotonic() - began < 30
    assert http.engines.counts.engine_failures == 0 and sync.group.pg is None
    sync.push_tensors(lambda: iter_safetensors(start), "e-1")
    for url in fleet.urls:
        assert requests.get(url + "/get_weight_version", timeout=10).json()["weight_version"] == "e-1"


def test_replacement_up_during_a_push_is_resynced(fleet, models, tmp_path):
    """Issue #39 item 8: an engine lost at a push's first bucket comes back (restart hook ->
    resync) while the push is still sending; its re-sync must reach it although the push leaves
    its URL out (before: the re-sync skipped it and it served the old weights)."""
    start, other = models
    http = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
    sync = WeightSync("tensor", engines=http, bucket_bytes=BUCKET)
    resynced = threading.Event()
    fleet.resync = lambda url: (sync.resync(url), resynced.set())
    killer = Killer(http, victim := fleet.engines[2], "/update_weights_from_tensor", after=1)
    main = threading.current_thread()

    def slow_source():  # after the first bucket, the push's own pass waits for the re-sync
        for item in iter_safetensors(other):
            if killer.pid is not None and threading.current_thread() is main:
                assert resynced.wait(120)
            yield item

    assert sync.push_tensors(slow_source, "t-1")["sync_engines_lost"] == 1.0
    assert victim.proc.pid != killer.pid
    for url in fleet.urls:
        assert_serves(url, other, "t-1")


def test_new_trainer_pushes_to_servers_holding_an_old_trainers_group(fleet, models):
    """Issue #39 item 8: servers outlive a trainer (a disaggregated server started on its own)
    and keep its weight-update group; the next trainer's group must not collide with it (before:
    both named weight_update_group_1, and the new trainer's first push failed with HTTP 400
    'already exists')."""
    start, other = models
    for i, weights in enumerate((start, other)):  # two trainers, one after the other
        sync = WeightSync("distributed", engines=HTTPRollout(fleet.urls), bucket_bytes=BUCKET)
        sync.push_tensors(lambda: iter_safetensors(weights), f"n-{i}")
    for url in fleet.urls:
        assert_serves(url, other, "n-1")
