"""Admission control and clients that leave: bounds on n and on the queue (400 when a request can
never fit, 503 when the server is busy), disconnects before / during a request abort its samples
with one log line and no traceback, abort_all is prompt, and a server under a load of small
requests plus hostile ones keeps serving the small ones correctly."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import pytest
import requests

from tests.sglang_kvc.hold import hold_when_running, raw_post

LONG = {"temperature": 0.0, "max_new_tokens": 900, "ignore_eos": True}
SMALL = {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}


class Records(logging.Handler):
    """Every record of a logger (uvicorn's do not propagate to pytest's caplog)."""

    def __init__(self, name: str):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.old_level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.old_level)

    def emit(self, record):
        self.records.append(record)

    def lines(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def _info(url: str) -> dict:
    return requests.get(url + "/get_server_info").json()


def _wait(cond, timeout=30.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition never held"
        time.sleep(0.02)


def _idle(srv) -> bool:
    info = _info(srv.url)
    return (info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
            and info["kv_pool"]["used"] == 0 and srv.engine.admission.samples == 0
            and srv.engine.admission.tokens == 0)


def _pool_post(url, body, path="/generate", timeout=120):
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return pool.submit(lambda: requests.post(url + path, json=body, timeout=timeout))


# ------------------------------------------------------------ bounds: 400 and 503


def test_huge_n_is_400_at_once_on_both_apis(serve, prompts):
    srv = serve("qwen2.5")
    t0 = time.time()
    r = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": {
        "n": 10 ** 8, "max_new_tokens": 4}})
    assert r.status_code == 400 and "--max-n" in r.json()["error"]["message"]
    r = requests.post(srv.url + "/v1/completions", json={"model": "m", "prompt": prompts[0],
                                                         "n": 10 ** 6, "max_tokens": 4})
    assert r.status_code == 400 and "--max-n" in r.json()["message"]
    assert time.time() - t0 < 10  # refused before 10^8 samples were built
    ok = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": SMALL})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 4
    assert _idle(srv)


def test_request_larger_than_the_queue_is_400(serve, prompts):
    srv = serve("qwen2.5", max_n=8, max_queued_requests=6, max_queued_tokens=3000)
    ok_n = requests.post(srv.url + "/generate", json={"text": prompts[0],
                                                      "sampling_params": dict(SMALL, n=6)})
    assert ok_n.status_code == 200 and len(ok_n.json()) == 6
    # 4 prompts x n=2 = 8 samples > 6: can never be queued, whatever the load
    r = requests.post(srv.url + "/generate", json={"text": prompts, "sampling_params": dict(SMALL, n=2)})
    assert r.status_code == 400 and "--max-queued-requests" in r.json()["error"]["message"]
    # 4 samples x (prompt + 900 new tokens) > 3000 tokens
    r = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": dict(LONG, n=4)})
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and "--max-queued-tokens" in msg, msg
    assert _idle(srv)


def test_full_queue_is_503_with_retry_after(serve, prompts):
    srv = serve("qwen2.5", max_queued_requests=4)
    with hold_when_running(srv.engine, n=4):  # "big" fills the queue until it is aborted
        fut = _pool_post(srv.url, {"text": prompts[0], "sampling_params": dict(LONG, n=4), "rid": "big"})
        _wait(lambda: _info(srv.url)["num_running_reqs"] == 4)
        r = requests.post(srv.url + "/generate", json={"text": prompts[1], "sampling_params": SMALL})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "retry" in r.json()["error"]["message"]
        r = requests.post(srv.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["code"] == 503
        requests.post(srv.url + "/abort_request", json={"rid": "big"})
        assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in fut.result(60).json())
    _wait(lambda: _idle(srv))
    r = requests.post(srv.url + "/generate", json={"text": prompts[1], "sampling_params": SMALL})
    assert r.status_code == 200


# ------------------------------------------------------------ clients that leave


def test_client_leaving_before_its_body_is_one_line(serve):
    srv = serve("qwen2.5")
    with Records("sglang_kvc.server") as ours, Records("uvicorn.error") as uv:
        for _ in range(5):
            s = raw_post(srv.url, "/generate", b'{"text": "hel', declared=200)
            time.sleep(0.05)
            s.close()
        _wait(lambda: len(ours.lines()) >= 5)
        time.sleep(0.3)
    assert len(ours.lines()) == 5 and all("before sending" in m for m in ours.lines())
    assert not [r for r in uv.records if r.levelno >= logging.ERROR]
    assert requests.get(srv.url + "/health").status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "The answer is", "sampling_params": dict(LONG, n=3)}),
    ("/generate", {"text": "The answer is", "sampling_params": dict(LONG, n=3), "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "The answer is", "n": 3, "max_tokens": 900,
                         "temperature": 0.0, "ignore_eos": True}),
    ("/v1/completions", {"model": "m", "prompt": "The answer is", "n": 3, "max_tokens": 900,
                         "temperature": 0.0, "ignore_eos": True, "stream": True}),
], ids=["generate", "generate-stream", "completions", "completions-stream"])
def test_client_leaving_mid_generation_aborts_its_samples(path, body, serve):
    import json

    srv = serve("qwen2.5")
    with Records("sglang_kvc.server") as ours, Records("uvicorn.error") as uv, \
            hold_when_running(srv.engine, n=3):  # held: only the abort can end the samples
        s = raw_post(srv.url, path, json.dumps(body).encode())
        _wait(lambda: _info(srv.url)["num_running_reqs"] == 3)
        s.close()
        _wait(lambda: _idle(srv), timeout=20)
        _wait(lambda: ours.lines())
    assert len(ours.lines()) == 1 and "left" in ours.lines()[0]
    assert not [r for r in uv.records if r.levelno >= logging.ERROR]


def test_abort_all_is_prompt_with_a_deep_queue(serve, prompts):
    srv = serve("qwen2.5", max_queued_tokens=10 ** 8)  # 3000 x 900 tokens: over 64 pools
    with hold_when_running(srv.engine):  # no sample finishes before the abort, however slow the posts
        futs = [_pool_post(srv.url, {"text": prompts[i % 4], "sampling_params": dict(LONG, n=100)})
                for i in range(30)]
        _wait(lambda: srv.engine.admission.samples == 3000)
        t0 = time.time()
        assert requests.post(srv.url + "/abort_request", json={"abort_all": True}).status_code == 200
        outs = [f.result(60) for f in futs]
        assert time.time() - t0 < 10
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for r in outs for o in r.json())
    _wait(lambda: _idle(srv))


# ------------------------------------------------------------ load


def _reference(srv, prompts) -> dict:
    """Greedy outputs computed alone, before the load: what every small request must get."""
    ref = {}
    for p in prompts:
        for k in (1, 4):
            r = requests.post(srv.url + "/generate", json={"text": p, "sampling_params": dict(
                SMALL, max_new_tokens=k)})
            ref[(p, k)] = r.json()["text"]
    return ref


def _small(url, prompt, k, i):
    if i % 3 == 2:  # a third through the OpenAI route
        r = requests.post(url + "/v1/completions", json={
            "model": "m", "prompt": prompt, "max_tokens": k, "temperature": 0.0,
            "ignore_eos": True}, timeout=300)
        return r.status_code, r.json()["choices"][0]["text"] if r.ok else r.text
    r = requests.post(url + "/generate", json={"text": prompt, "sampling_params": dict(
        SMALL, max_new_tokens=k)}, timeout=300)
    return r.status_code, r.json()["text"] if r.ok else r.text


def _hostile(url, i):
    if i % 4 == 0:
        return requests.post(url + "/generate", json={"text": "x", "sampling_params": {
            "n": 10 ** 8}}).status_code
    if i % 4 == 1:
        return requests.post(url + "/v1/completions", json={
            "model": "m", "prompt": "x", "n": 10 ** 6, "max_tokens": 4}).status_code
    try:  # the largest request the server takes, and a client that gives up on it
        requests.post(url + "/generate", json={"text": "x", "sampling_params": dict(
            LONG, n=128, max_new_tokens=10 ** 9)}, timeout=0.5 + (i % 3))
    except requests.Timeout:
        return "left"
    return "finished"


def _run_load(srv, prompts, count: int):
    ref = _reference(srv, prompts)
    jobs = [(prompts[i % 4], (1, 4)[i % 2], i) for i in range(count)]
    with Records("uvicorn.error") as uv, concurrent.futures.ThreadPoolExecutor(48) as pool:
        hostile = [pool.submit(_hostile, srv.url, i) for i in range(12)]
        small = [pool.submit(_small, srv.url, *job) for job in jobs]
        results = [f.result(timeout=600) for f in small]
        hostile_results = [f.result(timeout=600) for f in hostile]
    for (p, k, _), (status, text) in zip(jobs, results):
        assert status == 200, text
        assert text == ref[(p, k)]
    assert hostile_results.count(400) == 6 and hostile_results.count("left") == 6
    assert not [r for r in uv.records if r.levelno >= logging.ERROR]
    _wait(lambda: _idle(srv), timeout=60)


def test_load_1000_requests_with_hostile_clients(serve, prompts):
    """~15 s on 2 CPU cores."""
    _run_load(serve("qwen2.5"), prompts, 1000)
