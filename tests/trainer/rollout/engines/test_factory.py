"""The engines' one door: what the factory hands a rank for each placement, what a rank that
hosts none does, and how the weight transports learn which engines a push lost (by URL, through
the interface). No engine runs here: servers are URLs nothing listens on."""

from __future__ import annotations

import contextlib
import socket

import pytest

from trainer.rollout.engines.factory import connect_restarts, open_engines
from trainer.rollout.engines.interface import Engines, NoEngines
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.sharding import Placement


def _dead_url() -> str:
    """A URL nothing listens on (a port the OS just handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_rank_that_does_not_generate_holds_no_engines():
    engines = open_engines(Placement(2, None), server_urls=["http://a"])
    assert isinstance(engines, NoEngines) and not engines.hosted
    assert engines.pool() is None and engines.context_length() is None
    assert engines.decode_counters() == {} and engines.fault_metrics() == {}
    engines.abort_all()
    for ctx in (engines.kv_memory(), engines.device_work(asynchronous=True)):
        assert isinstance(ctx, contextlib.nullcontext)
    with pytest.raises(RuntimeError, match="takes no weight updates"):
        engines.update_weights("/update_weights_from_tensor", {}, [])


def test_servers_become_http_engines_with_their_urls():
    engines = open_engines(Placement(1, 0), server_urls=["http://a/", "http://b"])
    assert isinstance(engines, HTTPRollout) and isinstance(engines, Engines)
    assert engines.urls == ["http://a", "http://b"] and engines.hosted


def test_the_restart_hook_gets_the_sync_and_becomes_the_engines_hook():
    engines, given = HTTPRollout(["http://a"]), []

    class Sync:
        def resync(self, url):
            pass

    sync = Sync()

    def factory(resync):
        given.append(resync)
        return lambda dead: None

    connect_restarts(engines, factory, sync)
    assert given == [sync.resync] and engines.engines.on_failure is engines.on_engine_failure
    assert engines.on_engine_failure is not None
    connect_restarts(engines, None, sync)  # no launcher hook: the engine stays down
    assert engines.on_engine_failure is not None


def test_a_push_learns_the_lost_engines_by_url():
    """``update_weights`` returns the URLs of engines that failed and do not answer /health (marked
    down once, counted), not their failover slots; ``lose`` marks one found dead elsewhere."""
    dead, other = _dead_url(), _dead_url()
    engines = HTTPRollout([dead, other], health_timeout=0.5)
    assert engines.update_weights("/update_weights_from_tensor", {}, [dead]) == [dead]
    assert engines.urls == [other] and engines.engines.counts.engine_failures == 1
    engines.lose(other, "weight push: broken group")
    engines.lose("http://never-an-engine", "ignored")
    assert engines.urls == [] and engines.engines.counts.engine_failures == 2


class _RecordingEngine:
    """The sglang-kvc ``Engine`` methods the in-process door calls, recorded."""

    device = "cpu"

    def __init__(self):
        self.updates = []

    def update_weights_from_tensor(self, named_tensors, weight_version):
        self.updates.append(([n for n, _ in named_tensors], weight_version))


def test_weights_reach_an_in_process_engine_and_servers_through_one_door():
    """``WeightSync`` takes one ``engines``: an in-process engine gets the tensors themselves
    (``/update_weights_from_tensor`` with ``named_tensors``), in buckets, with the version; a
    server-only mode refuses it, and ``inprocess`` refuses servers."""
    import torch

    from trainer.rollout.engines.inprocess import EngineRollout
    from trainer.rollout.engines.weight_sync import WeightSync

    engine = _RecordingEngine()
    sync = WeightSync("inprocess", engines=EngineRollout(engine), bucket_bytes=16)
    tensors = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(2))]
    out = sync.push_tensors(lambda: iter(tensors), "v3")
    assert engine.updates == [(["a"], "v3"), (["b"], "v3"), (["c"], "v3")]
    assert out["sync_bytes"] == 40.0 and out["sync_engines_lost"] == 0.0
    with pytest.raises(RuntimeError, match="as tensors, not /update_weights_from_disk"):
        EngineRollout(engine).update_weights("/update_weights_from_disk", {}, [])
    with pytest.raises(ValueError, match="--weight-sync tensor needs --rollout-server-urls"):
        WeightSync("tensor", engines=EngineRollout(engine))
    with pytest.raises(ValueError, match="inprocess needs the in-process engine"):
        WeightSync("inprocess", engines=HTTPRollout(["http://a"]))


def test_the_gpus_that_generate_are_the_engines_own_else_the_jobs():
    """What the learner's ``perf/generate_*`` divides by: ``--rollout-num-gpus`` engines (their
    URLs by then), every GPU of a colocated job, unknown for servers elsewhere."""
    import dataclasses

    from trainer.rollout.engines.config import EngineConfig
    from trainer.rollout.engines.factory import generation_gpus

    colocated = EngineConfig("model", {})
    assert generation_gpus(colocated, 4) == 4
    own = dataclasses.replace(colocated, num_gpus=2, server_urls=["http://a", "http://b"])
    assert generation_gpus(own, 4) == 2
    assert generation_gpus(dataclasses.replace(colocated, server_urls=["http://a"]), 4) is None
