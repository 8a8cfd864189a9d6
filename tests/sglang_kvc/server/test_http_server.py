"""HTTP /generate and info endpoints: outputs equal HF greedy; bad input is 400 and harmless."""

from __future__ import annotations

import json

import pytest
import requests

from checkpoint_tools.tiny_models import FAMILIES

N_NEW = 16
GREEDY = {"temperature": 0.0, "max_new_tokens": N_NEW, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers(serve):
    made = {}

    def get(name="qwen2.5"):
        if name not in made:
            made[name] = serve(name)
        return made[name]

    return get


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_http_greedy_matches_hf(family, servers, tiny_models, hf_reference, prompts):
    srv = servers(family)
    r = requests.post(srv.url + "/generate", json={"text": prompts, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == len(prompts)
    tok = srv.engine.tokenizer
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == hf_reference(tiny_models[family], tok.encode(p), N_NEW)
        assert o["text"] == tok.decode(o["output_ids"], skip_special_tokens=True)
    # input_ids, batched, give the same result
    ids = [tok.encode(p) for p in prompts]
    r2 = requests.post(srv.url + "/generate", json={"input_ids": ids, "sampling_params": GREEDY})
    assert [o["output_ids"] for o in r2.json()] == [o["output_ids"] for o in outs]


def test_single_and_n_shapes(servers, prompts):
    url = servers().url + "/generate"
    single = requests.post(url, json={"text": prompts[0], "sampling_params": GREEDY,
                                      "return_logprob": True, "rid": "abc"}).json()
    assert isinstance(single, dict)
    meta = single["meta_info"]
    assert meta["id"] == "abc" and meta["weight_version"] == "default"
    # an earlier request of this module's server may have cached the prompt: all but its last token
    assert 0 <= meta["cached_tokens"] < meta["prompt_tokens"] and meta["e2e_latency"] > 0
    assert len(meta["output_token_logprobs"]) == N_NEW
    assert all(len(e) == 3 and e[2] is None for e in meta["output_token_logprobs"])
    many = requests.post(url, json={"text": prompts[0], "sampling_params": dict(GREEDY, n=3)}).json()
    assert isinstance(many, list) and len(many) == 3
    # samples 2 and 3 share sample 1's prefill (prefix sharing): their whole prompt was cached
    assert [m["meta_info"]["cached_tokens"] == m["meta_info"]["prompt_tokens"] for m in many] == \
        [False, True, True]


def test_stream_sse(servers, prompts):
    srv = servers()
    r = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": GREEDY,
                                                   "stream": True}, stream=True)
    assert r.status_code == 200
    events = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len(chunks) == N_NEW
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    full = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": GREEDY}).json()
    assert chunks[-1]["output_ids"] == full["output_ids"] and chunks[-1]["text"] == full["text"]
    assert all(full["text"].startswith(c["text"]) for c in chunks)


BAD_REQUESTS = [
    ("both text and ids", {"text": "hi", "input_ids": [1, 2]}),
    ("no input", {"sampling_params": {}}),
    ("empty text", {"text": ""}),
    ("empty ids", {"input_ids": []}),
    ("prompt longer than context", {"input_ids": [5] * 5000}),
    ("negative max_new_tokens", {"text": "hi", "sampling_params": {"max_new_tokens": -3}}),
    ("float max_new_tokens", {"text": "hi", "sampling_params": {"max_new_tokens": 2.5}}),
    ("string max_new_tokens", {"text": "hi", "sampling_params": {"max_new_tokens": "7"}}),
    ("unknown sampling key", {"text": "hi", "sampling_params": {"temprature": 0.5}}),
    ("out-of-vocab id", {"input_ids": [1, 2, 10 ** 6]}),
    ("negative id", {"input_ids": [1, -2]}),
    ("non-int id", {"input_ids": [1, "x"]}),
    ("bad temperature", {"text": "hi", "sampling_params": {"temperature": -1}}),
    ("unknown field", {"text": "hi", "bogus_field": 1}),
    ("not an object", [1, 2, 3]),
]


@pytest.mark.parametrize("name,body", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_is_400(name, body, servers, prompts):
    srv = servers()
    r = requests.post(srv.url + "/generate", json=body)
    assert r.status_code == 400, (name, r.status_code, r.text)
    assert r.json()["error"]["message"]
    ok = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": GREEDY})
    assert ok.status_code == 200


def test_malformed_json_is_400(servers):
    srv = servers()
    r = requests.post(srv.url + "/generate", data="{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    assert requests.get(srv.url + "/health").status_code == 200


def test_info_endpoints(servers):
    srv = servers()
    assert requests.get(srv.url + "/health").status_code == 200
    assert requests.get(srv.url + "/health_generate").status_code == 200
    info = requests.get(srv.url + "/get_model_info").json()
    assert info["model_path"] == srv.engine.args.model_path and info["is_generation"] is True
    sinfo = requests.get(srv.url + "/get_server_info").json()
    assert sinfo["max_total_num_tokens"] == srv.engine.kv.capacity
    assert {"num_running_reqs", "num_waiting_reqs", "kv_pool", "mem_fraction_static"} <= set(sinfo)
    assert sinfo["kv_pool"]["used"] == 0
    assert requests.get(srv.url + "/get_weight_version").json() == {"weight_version": "default"}
    assert requests.get(srv.url + "/flush_cache").status_code == 200
    models = requests.get(srv.url + "/v1/models").json()
    assert models["data"][0]["id"] == srv.engine.args.model_path
