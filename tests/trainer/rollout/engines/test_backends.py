"""The HTTP backend batches samples into SGLang ``/generate`` requests (lists of ``input_ids``):
which samples go together, to which engine, and that the answers come back in sample order
and equal to one request per sample on a real server."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from trainer.rollout.engines.interface import RolloutConfig, sample_requests
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig


class _Echo(http.server.BaseHTTPRequestHandler):
    """A batched /generate that answers each sample with one token: the sum of its prompt plus
    its sampling seed; it records every body it got."""

    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append((self.server.server_address[1], body))
        outs = [{"text": "t", "meta_info": {
            "output_token_logprobs": [[-1.0, sum(ids) + p["sampling_seed"], None]],
            "finish_reason": {"type": "length"}}}
            for ids, p in zip(body["input_ids"], body["sampling_params"])]
        data = json.dumps(outs if body.get("short") is None else outs[:-1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_servers():
    _Echo.bodies = []
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()


def test_samples_are_batched_per_engine_and_returned_in_order(echo_servers):
    prompts = [[i, 1] for i in range(5)]
    cfg = RolloutConfig(seed=100, samples_per_request=3, max_response_len=8)
    gens = HTTPRollout(echo_servers).generate(prompts, 2, cfg)
    # sample k = prompt k // 2, seed 100 + k: its one token is sum(prompt) + seed
    assert [g.response_ids for g in gens] == [[k // 2 + 1 + 100 + k] for k in range(10)]
    ports = [int(u.rsplit(":", 1)[1]) for u in echo_servers]
    sent = {(port, tuple(p["sampling_seed"] - 100 for p in b["sampling_params"]))
            for port, b in _Echo.bodies}
    # engine 0 takes the even samples, engine 1 the odd ones, at most 3 per request
    assert sent == {(ports[0], (0, 2, 4)), (ports[0], (6, 8)),
                    (ports[1], (1, 3, 5)), (ports[1], (7, 9))}
    assert all(b["return_logprob"] is True and len(b["input_ids"]) == len(b["sampling_params"])
               for _, b in _Echo.bodies)


def test_one_request_per_sample_when_asked(echo_servers):
    cfg = RolloutConfig(seed=0, samples_per_request=1)
    HTTPRollout(echo_servers[:1]).generate([[1], [2], [3]], 1, cfg)
    assert sorted(len(b["input_ids"]) for _, b in _Echo.bodies) == [1, 1, 1]


def test_an_answer_with_the_wrong_number_of_samples_is_an_error(echo_servers):
    requests = sample_requests([[1], [2]], 1, RolloutConfig(seed=0))
    rollout = HTTPRollout(echo_servers[:1])
    send = rollout._send
    rollout._send = lambda url, payload: send(url, {**payload, "short": True})
    with pytest.raises(RuntimeError, match="answered 1 results for 2 samples"):
        rollout.run(requests, RolloutConfig(seed=0))


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    args = ["--device", "cpu", "--max-total-tokens", "8192", "--log-level", "warning"]
    cfg = FleetConfig(str(tiny_model_factory("qwen2.5")), 1, args, start_timeout=120,
                      log_dir=str(tmp_path_factory.mktemp("server")))
    with EngineFleet(cfg) as fleet:
        yield fleet.urls[0]


def test_a_batched_request_equals_one_request_per_sample_on_a_server(server):
    """Seeded samples on a real sglang-kvc server: one batched request of 8, or 8 requests one
    at a time, give the same tokens and log-probs."""
    prompts = [[3 + i, 5, 7] for i in range(4)]
    cfg = RolloutConfig(max_response_len=40, seed=77)
    batched = HTTPRollout([server]).generate(prompts, 2, cfg)
    one_by_one = HTTPRollout([server]).generate(
        prompts, 2, RolloutConfig(max_response_len=40, seed=77, samples_per_request=1,
                                  concurrency=1))
    assert [g.response_ids for g in batched] == [g.response_ids for g in one_by_one]
    for a, b in zip(batched, one_by_one):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert len(a.response_ids) == 40 or a.finish_reason == "stop"
