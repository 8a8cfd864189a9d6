"""Sessions over HTTP (SGLang's /open_session, /close_session and /generate session_params):
the same turns through the server and through `Engine.generate` give the same tokens,
log-probs and eviction records; bad session input is HTTP 400 and the server keeps serving."""

from __future__ import annotations

import pytest
import requests
import torch

from sglang_kvc import decode_eviction_record

SAMPLING = {"temperature": 0.8, "max_new_tokens": 16, "ignore_eos": True}


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


TURNS = [tokens(13, seed=1), tokens(8, seed=2), tokens(5, seed=3)]


def http_turns(url):
    sid = requests.post(f"{url}/open_session", json={"capacity_of_str_len": 1000}).json()
    outs, prev = [], None
    for i, ids in enumerate(TURNS):
        r = requests.post(f"{url}/generate", json={
            "input_ids": ids, "return_logprob": True, "return_eviction_record": True,
            "sampling_params": dict(SAMPLING, sampling_seed=i),
            "session_params": {"id": sid, "rid": prev}})
        assert r.status_code == 200, r.text
        outs.append(r.json())
        prev = outs[-1]["meta_info"]["id"]
    assert requests.post(f"{url}/close_session", json={"session_id": sid}).status_code == 200
    return outs


def engine_turns(eng):
    sid = eng.open_session(1000)
    outs, prev = [], None
    for i, ids in enumerate(TURNS):
        outs.append(eng.generate(input_ids=ids, return_logprob=True, return_eviction_record=True,
                                 sampling_params=dict(SAMPLING, sampling_seed=i),
                                 session_params={"id": sid, "rid": prev}))
        prev = outs[-1]["meta_info"]["id"]
    eng.close_session(sid)
    return outs


@pytest.fixture(scope="module")
def server(serve):
    return serve(compress_algorithm="rkv", compress_max_prompt=8, compress_divide_length=4,
                 compress_max_window=2)


def test_http_equals_in_process(server):
    via_http, in_process = http_turns(server.url), engine_turns(server.engine)
    for h, e in zip(via_http, in_process):
        hm, em = h["meta_info"], e["meta_info"]
        assert h["output_ids"] == e["output_ids"]
        assert [x[0] for x in hm["output_token_logprobs"]] == \
            pytest.approx([x[0] for x in em["output_token_logprobs"]], abs=1e-6)
        assert hm["session_context_len"] == em["session_context_len"]
        assert torch.equal(decode_eviction_record(hm["eviction_record"]), em["eviction_record"])
    last = via_http[-1]["meta_info"]
    assert last["session_context_len"] == sum(map(len, TURNS)) + 2 * SAMPLING["max_new_tokens"]
    assert last["compression"]["num_compressions"] > 0
    assert server.engine.get_server_info()["sessions"] == {
        "open": 0, "parked_requests": 0, "parked_slots": 0}


@pytest.mark.parametrize("path,body,message", [
    ("/generate", {"input_ids": [5], "session_params": {"id": "nope"}}, "unknown session id"),
    ("/generate", {"input_ids": [5], "session_params": {"id": "S", "rid": "x"}},
     "not a finished request"),
    ("/generate", {"input_ids": [5], "session_params": {"id": "S", "replace": True}},
     "replace"),
    ("/generate", {"input_ids": [5], "session_params": "S"}, "session_params must be an object"),
    ("/close_session", {"session_id": "nope"}, "unknown session id"),
    ("/close_session", {}, "session_id is required"),
    ("/open_session", {"session_id": "S"}, "already open"),
    ("/open_session", {"capacity_of_str_len": -1}, "capacity_of_str_len"),
])
def test_bad_session_input_is_400_and_the_server_keeps_serving(server, path, body, message):
    url = server.url
    sid = requests.post(f"{url}/open_session", json={"session_id": "S"})
    try:
        r = requests.post(f"{url}{path}", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        ok = requests.post(f"{url}/generate", json={
            "input_ids": [5, 6], "session_params": {"id": "S"},
            "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200
    finally:
        if sid.status_code == 200:
            requests.post(f"{url}/close_session", json={"session_id": "S"})
