"""Weights to external servers over a process group (SGLang's ``init_weights_update_group`` /
``update_weights_from_distributed``; gloo on a CPU): after the trainer's push a real server
process computes the new weights' log-probs, checked against the HF forward of those weights; and
``--weight-sync auto``'s fallback when the group cannot be made: the next mode carries the first
push, every later push goes by it, an explicit mode fails instead."""

from __future__ import annotations

import pytest
import requests
import torch

from sglang_kvc.weights.transport import deserialize_named_tensors
from sglang_kvc.weights.loader import iter_safetensors
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.weight_sync import WeightSync

SERVER = ["--device", "cpu", "--max-total-tokens", "2048", "--log-level", "warning"]
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 11, 128]


def served_logprobs(url: str) -> torch.Tensor:
    """The server's log-prob of each prompt token given its prefix (positions 1..)."""
    r = requests.post(url + "/generate", json={
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True, "logprob_start_len": 0}, timeout=120)
    assert r.status_code == 200, r.text
    return torch.tensor([e[0] for e in r.json()["meta_info"]["input_token_logprobs"][1:]])


def hf_logprobs(checkpoint) -> torch.Tensor:
    """The same log-probs from transformers' forward of ``checkpoint`` (the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    return lp[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]


@pytest.mark.slow
def test_server_serves_the_new_weights_after_a_distributed_push(tiny_model_factory, tmp_path):
    start = tiny_model_factory("qwen2.5")
    new = tiny_model_factory("qwen2.5", seed=3)
    cfg = FleetConfig(str(start), 1, SERVER, start_timeout=180, log_dir=str(tmp_path / "logs"))
    with EngineFleet(cfg) as fleet:
        url = fleet.urls[0]
        before = served_logprobs(url)
        assert torch.allclose(before, hf_logprobs(start), atol=1e-4)
        # 64 KiB buckets: several broadcasts of flattened buckets
        sync = WeightSync("distributed", engines=HTTPRollout(fleet.urls), bucket_bytes=64 << 10)
        stats = sync.push_tensors(lambda: iter_safetensors(new), "v1")
        assert stats["sync_engines_lost"] == 0
        assert {"export", "flatten", "group", "transfer"} <= set(sync.phases.seconds)
        after = served_logprobs(url)
        assert not torch.allclose(after, before, atol=1e-3)  # the push changed what it serves
        assert torch.allclose(after, hf_logprobs(new), atol=1e-4)
        version = requests.get(url + "/get_weight_version", timeout=10).json()["weight_version"]
        assert version == "v1"
        sync.push_tensors(lambda: iter_safetensors(start), "v2")  # the same group again
        assert torch.allclose(served_logprobs(url), hf_logprobs(start), atol=1e-4)


class RefusingServers:
    """Servers that refuse to join a weight-update group (as one on the trainer's own GPU does
    with NCCL) and take tensors over HTTP: what each update carried, by path."""

    over_http = True
    urls = ["http://server-0"]

    def __init__(self):
        self.updates: list[tuple[str, dict]] = []

    def wait_for_restarts(self, timeout=None):
        return True

    def post(self, url, payload, retries=1):
        raise RuntimeError(f"{url}: HTTP 500: NCCL error: duplicate GPU")

    def alive(self, url):
        return True

    def update_weights(self, path, payload, urls):
        self.updates.append((path, payload))
        return []


@pytest.fixture(autouse=True)
def _abandoned_rendezvous_end():
    """The trainer's side of a group no server joined waits out its timeout in a daemon thread:
    let it end inside the test (a C++ wait still running at exit aborts the process)."""
    import threading

    yield
    for t in threading.enumerate():
        if t.name == "weight-group":
            t.join(timeout=30)


def _named():
    torch.manual_seed(0)
    return [("model.embed_tokens.weight", torch.randn(8, 4)), ("lm_head.weight", torch.randn(8, 4))]


def test_auto_falls_back_when_the_group_cannot_be_made():
    named, servers = _named(), RefusingServers()
    sync = WeightSync("distributed", engines=servers, fallback=("tensor",), group_timeout_s=1)
    sync.push_tensors(lambda: iter(named), "v1")
    assert sync.mode == "tensor" and len(servers.updates) == 1
    path, payload = servers.updates[0]
    assert path == "/update_weights_from_tensor" and payload["weight_version"] == "v1"
    got = deserialize_named_tensors(payload["serialized_named_tensors"][0])
    assert [n for n, _ in got] == [n for n, _ in named]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, named))
    sync.push_tensors(lambda: iter(named), "v2")  # straight by tensor now
    assert [p["weight_version"] for _, p in servers.updates] == ["v1", "v2"]


def test_an_explicit_mode_fails_instead_of_falling_back():
    sync = WeightSync("distributed", engines=RefusingServers(), group_timeout_s=1)
    with pytest.raises(RuntimeError, match="distributed weight update failed"):
        sync.push_tensors(lambda: iter(_named()), "v1")


def test_auto_picks_nccl_for_servers_it_can_reach(monkeypatch):
    """``auto`` with servers on a GPU: distributed when they can reach the trainer (same host,
    or a master address that is not loopback), with the fallbacks of their place."""
    from argparse import Namespace

    import trainer.rollout.engines.config as config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("MASTER_ADDR", raising=False)

    def resolved(urls, master=None, mode="auto"):
        args = Namespace(weight_sync=mode, rollout_server_urls=urls, rollout_engine_urls=None,
                         rollout_num_gpus=0, rollout_engine_process=False,
                         weight_sync_master_address=master, weight_sync_bucket_mb=512,
                         weight_sync_timeout=120.0)
        ws = config.weight_sync_config_from_args(args)
        return ws.mode, ws.fallback

    assert resolved(["http://127.0.0.1:30000"]) == ("distributed", ("ipc", "disk"))
    assert resolved(["http://gpu-node-7:30000"]) == ("tensor", ())
    assert resolved(["http://gpu-node-7:30000"], master="10.0.0.5") == ("distributed", ("tensor",))
    assert resolved(["http://127.0.0.1:30000"], mode="distributed") == ("distributed", ())
