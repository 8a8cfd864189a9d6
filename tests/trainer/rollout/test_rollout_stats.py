"""Per-rollout statistics a user reads for long rollouts: preemptions and the tail's share."""

from __future__ import annotations

from trainer.rollout.engines.interface import Generation
from trainer.rollout.manager import sample_stats, tail_stats


def _gen(latency, preempted=0, n=3):
    return Generation([1] * n, [0.0] * n, "", "stop", None,
                      {"e2e_latency": latency, "num_preemptions": preempted, "prompt_tokens": 2})


def test_tail_is_the_share_after_90_percent_finished():
    gens = [_gen(float(t)) for t in (1, 2, 3, 4, 5, 6, 7, 8, 9, 20)]
    # sorted latencies; index int(0.9 * 10) = 9 -> 20 itself: one sample in ten is the tail edge
    assert tail_stats(gens) == {"rollout_tail_fraction": 0.0}
    gens = [_gen(float(t)) for t in [1.0] * 18 + [2.0, 10.0]]
    # 20 samples: the 90th percentile (index 18) finished at 2 s, the last at 10 s -> 0.8
    assert tail_stats(gens)["rollout_tail_fraction"] == (10.0 - 2.0) / 10.0


def test_tail_without_latencies_is_absent():
    g = Generation([1], [0.0], "", "stop", None, {})
    assert tail_stats([g]) == {}


def test_preemptions_are_summed():
    stats = sample_stats([_gen(1.0, 2), _gen(2.0, 0), _gen(3.0, 1)], [1.0, 0.0, 1.0])
    assert stats["rollout_preemptions"] == 3.0
    assert stats["rollout_tail_fraction"] == 0.0


def _remote_manager(monkeypatch, infos: dict):
    """A bare RolloutManager of remote servers whose /get_server_info answers ``infos[url]``
    (``http://down`` refuses the connection)."""
    import types

    from trainer.rollout import manager
    from trainer.rollout.engines import servers

    def fake_get(url, timeout):
        base = url.removesuffix("/get_server_info")
        if base == "http://down":
            raise ConnectionError("refused")
        return types.SimpleNamespace(json=lambda: infos[base])

    monkeypatch.setattr(servers.requests, "get", fake_get)
    rm = manager.RolloutManager.__new__(manager.RolloutManager)
    rm.plugin = None
    return rm


def test_remote_servers_report_the_fullest_pool(monkeypatch):
    """Disaggregated rank 0 asks each server's /get_server_info; one that does not answer (or a
    stock server without kv_pool) is skipped, and none answering gives no pool metric."""
    from trainer.rollout import manager
    from trainer.rollout.engines import servers

    rm = _remote_manager(monkeypatch, {
        "http://a": {"kv_pool": {"peak_used": 10, "bytes_per_slot": 4, "capacity": 100}},
        "http://b": {"kv_pool": {"peak_used": 30, "bytes_per_slot": 4, "capacity": 90}},
        "http://c": {"model": "stock"}})
    rm.engines = servers.HTTPRollout(["http://a", "http://down", "http://b", "http://c"])
    assert rm.pool_stats() == {"peak_used": 30, "bytes_per_slot": 4, "capacity": 90}
    rm.engines = servers.HTTPRollout(["http://down", "http://c"])
    assert rm.pool_stats() is None
    stats = manager.engine_stats([manager.Shard([], 1.0, 0.0, {"peak_used": 30, "bytes_per_slot": 4,
                                                                 "capacity": 90})])
    assert stats["kv_pool_peak_bytes"] == 120.0 and stats["kv_pool_capacity"] == 90.0


def test_remote_context_length_from_the_first_server(monkeypatch):
    """A remote engine's context length comes from its /get_server_info; a server that does not
    answer, or does not say, leaves it unknown (plug-ins then do not clamp)."""
    from trainer.rollout.engines import servers

    rm = _remote_manager(monkeypatch, {"http://a": {"context_length": "4096"},
                                       "http://stock": {"model": "x"}})
    for urls, want in ((["http://a", "http://down"], 4096), (["http://down"], None),
                       (["http://stock"], None)):
        rm.engines = servers.HTTPRollout(urls)
        assert rm._ask_context_length() == want
