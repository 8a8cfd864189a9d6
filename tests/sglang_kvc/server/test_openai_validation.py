"""The OpenAI routes validate as /generate does: unknown fields are a 400, and errors name the
field the user sent (`max_tokens`, not the native `max_new_tokens`)."""

from __future__ import annotations

import pytest
import requests

openai = pytest.importorskip("openai")  # the GPU machine has no openai SDK


@pytest.fixture(scope="module")
def srv(serve):
    return serve("qwen2.5")


CASES = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, "max_tokens must be an integer"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "bogus": 1}, "unknown request field(s): bogus"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 4},
     "min_tokens must be in [0, max_tokens]"),
    ("/v1/completions", {"prompt": "hi", "seed": 1.5}, "seed must be an integer"),
    ("/v1/completions", {"prompt": [1, "x"]}, "prompt must contain only integers"),
    ("/v1/completions", {"prompt": "hi", "user": 3}, "user must be str"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": -1}, "max_completion_tokens must be >= 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temprature": 0},
     "unknown request field(s): temprature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tool_choice": "required"}, "tool_choice"),
]


@pytest.mark.parametrize("path,body,message", CASES, ids=[c[2][:30] for c in CASES])
def test_openai_errors_name_the_users_field(path, body, message, srv):
    r = requests.post(srv.url + path, json=dict(body, model="m"))
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "BadRequestError" and message in err["message"], err["message"]
    assert "max_new_tokens" not in err["message"] and "sampling_seed" not in err["message"]


def test_native_names_stay_on_generate(srv):
    r = requests.post(srv.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": "4"}})
    assert r.status_code == 400 and "max_new_tokens must be an integer" in r.json()["error"]["message"]


def test_fields_clients_send_are_accepted(srv):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    r = c.completions.create(model="m", prompt="hi", max_tokens=2, user="u1", seed=3,
                             stream_options=None, extra_body={"top_k": 5, "ignore_eos": True})
    assert r.usage.completion_tokens == 2
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                  max_completion_tokens=2, metadata={"a": "b"}, store=False,
                                  tool_choice="none")
    assert r.usage.completion_tokens <= 2
    with pytest.raises(openai.BadRequestError, match="unknown request field"):
        c.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"bogus": 1})
