"""Abort, pause/continue, memory release/resume, and 64 concurrent requests on a tiny pool."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import requests

from tests.sglang_kvc.hold import hold_when_running, wait_until

LONG = {"temperature": 0.0, "max_new_tokens": 900, "ignore_eos": True}


def _wait_running(url, n=1, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if requests.get(url + "/get_server_info").json()["num_running_reqs"] >= n:
            return
        time.sleep(0.005)
    raise AssertionError("request never started running")


def _post_async(url, body):
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return pool.submit(lambda: requests.post(url + "/generate", json=body, timeout=120).json())


def test_abort_by_rid_and_all(serve, prompts):
    srv = serve("qwen2.5")
    with hold_when_running(srv.engine):  # held: only the abort can end it, on any machine
        fut = _post_async(srv.url, {"text": prompts[0], "sampling_params": LONG, "rid": "victim"})
        _wait_running(srv.url)
        assert requests.post(srv.url + "/abort_request", json={"rid": "victim"}).status_code == 200
        out = fut.result(timeout=60)
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < LONG["max_new_tokens"]

    with hold_when_running(srv.engine, n=3):
        futs = [_post_async(srv.url, {"text": p, "sampling_params": LONG}) for p in prompts[:3]]
        _wait_running(srv.url, 3)
        requests.post(srv.url + "/abort_request", json={"abort_all": True})
        outs = [f.result(timeout=60) for f in futs]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    info = requests.get(srv.url + "/get_server_info").json()
    assert info["num_running_reqs"] == 0 and info["kv_pool"]["used"] == 0


def test_abort_streaming_request(serve, prompts):
    srv = serve("qwen2.5")
    with hold_when_running(srv.engine):  # held after its first token: only the abort ends it
        r = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": LONG,
                                                       "stream": True, "rid": "s1"}, stream=True)
        lines = r.iter_lines(decode_unicode=True)
        next(x for x in lines if x)  # first chunk arrived: it is running
        requests.post(srv.url + "/abort_request", json={"rid": "s1"})
        events = [x for x in lines if x]
    assert events[-1] == "data: [DONE]"
    assert '"abort"' in events[-2]


def test_pause_and_continue(serve, prompts):
    srv = serve("qwen2.5")
    body = {"text": prompts[1], "sampling_params": {"temperature": 0.0, "max_new_tokens": 20,
                                                    "ignore_eos": True}}
    expected = requests.post(srv.url + "/generate", json=body).json()["output_ids"]
    r = requests.post(srv.url + "/pause_generation", json={})
    assert r.json()["status"] == "ok"
    fut = _post_async(srv.url, body)
    wait_until(lambda: srv.engine.get_server_info()["num_waiting_reqs"] == 1, what="queued")
    assert not fut.done()
    info = requests.get(srv.url + "/get_server_info").json()
    assert info["paused"] and info["num_running_reqs"] == 0
    requests.post(srv.url + "/continue_generation", json={})
    assert fut.result(timeout=60)["output_ids"] == expected


def test_pause_retract_mid_generation_then_continue(serve, prompts):
    srv = serve("qwen2.5")
    body = {"text": prompts[2], "sampling_params": {"temperature": 0.0, "max_new_tokens": 300,
                                                    "ignore_eos": True}}
    expected = requests.post(srv.url + "/generate", json=body).json()["output_ids"]
    with hold_when_running(srv.engine):  # retracted mid-generation on any machine
        fut = _post_async(srv.url, body)
        _wait_running(srv.url)
        requests.post(srv.url + "/pause_generation", json={"mode": "retract"})
        info = requests.get(srv.url + "/get_server_info").json()
        assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 1
        assert info["kv_pool"]["used"] == 0
    # leaving the hold continues generation (as /continue_generation, tested above)
    assert fut.result(timeout=60)["output_ids"] == expected  # recomputed, same tokens


def test_release_and_resume_memory(serve, prompts):
    srv = serve("qwen2.5")
    body = {"text": prompts[0], "sampling_params": {"temperature": 0.0, "max_new_tokens": 8}}
    before = requests.post(srv.url + "/generate", json=body).json()["output_ids"]
    assert requests.post(srv.url + "/release_memory_occupation", json={}).status_code == 200
    assert not srv.engine.kv.pool.allocated
    assert requests.post(srv.url + "/resume_memory_occupation", json={}).status_code == 200
    assert requests.post(srv.url + "/generate", json=body).json()["output_ids"] == before
    bad = requests.post(srv.url + "/release_memory_occupation", json={"tags": ["nonsense"]})
    assert bad.status_code == 400


def test_64_concurrent_requests_with_preemption(serve, tiny_models, hf_reference):
    """A 700-token pool cannot hold 64 requests of up to ~100 tokens: admission queues them and
    decode growth forces preemptions; every output must still equal HF greedy."""
    srv = serve("qwen2-untied", max_total_tokens=700)
    tok = srv.engine.tokenizer
    words = "the quick brown fox jumps over the lazy dog 1 2 3 4 5 6 7 8 9 10".split()
    bodies = []
    for i in range(64):
        text = " ".join(words[j % len(words)] for j in range(i % 13 + 2))
        bodies.append({"text": text, "sampling_params": {"temperature": 0.0, "ignore_eos": True,
                                                         "max_new_tokens": 20 + (i * 7) % 60}})
    start_preempt = srv.engine.scheduler.num_preemptions
    peak = {"used": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak["used"] = max(peak["used"], srv.engine.kv.capacity - srv.engine.kv.num_free)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        outs = list(pool.map(lambda b: requests.post(srv.url + "/generate", json=b, timeout=300).json(), bodies))
    stop.set()
    watcher.join()
    assert srv.engine.scheduler.num_preemptions > start_preempt
    assert peak["used"] <= 700
    for b, o in zip(bodies, outs):
        n = b["sampling_params"]["max_new_tokens"]
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": n}
        assert o["output_ids"] == hf_reference(tiny_models["qwen2-untied"], tok.encode(b["text"]), n)
    assert sum(o["meta_info"]["num_preemptions"] for o in outs) > 0
    info = requests.get(srv.url + "/get_server_info").json()
    assert info["kv_pool"]["used"] == 0 and info["num_preemptions"] > 0
