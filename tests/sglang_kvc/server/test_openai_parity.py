"""OpenAI parity: a client that sends every field (the official SDK, a LangChain-style raw body)
is served, neutral values change nothing, other values of unimplemented features are a 400
that says why, tools and reasoning_effort reach the chat template, stream_options adds usage, and
max_tokens past the context is SGLang's 400, and logit_bias reaches the sampler.

Mutation checks: dropping a field from openai_fields.IGNORED/NEUTRAL fails the every-field tests;
passing `kwargs` without tools to the template fails test_tools_reach_the_template; removing the
`refuse_past_context` check in intake fails test_max_tokens_past_the_context."""

from __future__ import annotations

import shutil

import pytest
import requests

openai = pytest.importorskip("openai")  # the GPU machine has no openai SDK

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
# A template that shows what reached it: the tools and the thinking switch.
TEMPLATE = ("{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
            "{% if enable_thinking is defined and not enable_thinking %}NOTHINK\n{% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")

# What LangChain's ChatOpenAI (and most OpenAI-compatible clients) send on every call.
LANGCHAIN_BODY = {
    "model": "m", "messages": MESSAGES, "stream": False, "n": 1, "temperature": 0.0,
    "top_p": 1.0, "max_tokens": 4, "max_completion_tokens": None, "presence_penalty": 0,
    "frequency_penalty": 0.0, "logit_bias": {}, "seed": 7, "stop": None, "user": "alice",
    "logprobs": False, "top_logprobs": None, "tools": [], "tool_choice": None,
    "parallel_tool_calls": True, "response_format": {"type": "text"}, "stream_options": None,
    "metadata": {"run": "1"}, "store": False, "service_tier": "auto", "functions": [],
    "function_call": None, "modalities": ["text"], "audio": None, "prediction": None,
    "reasoning_effort": None, "verbosity": "medium", "prompt_cache_key": "k",
    "safety_identifier": "s", "web_search_options": None,
}
# SGLang's own extras (ChatCompletionRequest), at their defaults.
SGLANG_EXTRAS = {
    "top_k": -1, "min_p": 0.0, "min_tokens": 0, "regex": None, "ebnf": None,
    "repetition_penalty": 1.0, "stop_token_ids": None, "stop_regex": None, "no_stop_trim": False,
    "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
    "lora_path": None, "session_id": "x", "session_params": None, "separate_reasoning": True,
    "stream_reasoning": True, "chat_template_kwargs": None, "return_hidden_states": False,
    "return_routed_experts": False, "routed_experts_start_len": 0,
    "return_cached_tokens_details": False, "return_prompt_token_ids": False,
    "return_token_ids": False, "return_meta_info": False, "task": None, "max_dynamic_patch": None,
    "min_dynamic_patch": None, "use_audio_in_video": False, "images_config": None,
    "custom_logit_processor": None, "custom_params": None, "rid": None, "extra_key": None,
    "cache_salt": None, "ngram_corpus_id": None, "priority": None, "bootstrap_host": None,
    "bootstrap_port": None, "bootstrap_room": None, "routed_dp_rank": None,
    "disagg_prefill_dp_rank": None, "data_parallel_rank": None,
}


@pytest.fixture(scope="module")
def srv(serve, tiny_models, tmp_path_factory):
    model = tmp_path_factory.mktemp("templated") / "qwen2.5"
    shutil.copytree(tiny_models["qwen2.5"], model)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    tiny_models["qwen2.5-templated"] = model
    return serve("qwen2.5-templated", context_length=256)


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def _chat(srv, **body):
    return requests.post(srv.url + "/v1/chat/completions", json=dict({"messages": MESSAGES}, **body))


def test_langchain_body_with_every_field_equals_the_plain_request(srv):
    plain = _chat(srv, max_tokens=4, temperature=0.0, seed=7).json()
    r = _chat(srv, **LANGCHAIN_BODY, **SGLANG_EXTRAS)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert r.json()["usage"] == plain["usage"]


def test_sdk_chat_with_every_argument(client, srv):
    plain = _chat(srv, max_tokens=3, temperature=0.0).json()["choices"][0]["message"]["content"]
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, frequency_penalty=0, presence_penalty=0.0, logit_bias={},
        logprobs=True, top_logprobs=2, max_completion_tokens=3, n=1, seed=1, stop=["\n\n\n"],
        temperature=0.0, top_p=1.0, user="u", tools=TOOLS, tool_choice="none",
        parallel_tool_calls=False, response_format={"type": "text"}, metadata={"a": "b"},
        store=False, service_tier="auto", modalities=["text"], reasoning_effort=None,
        prompt_cache_key="k", safety_identifier="s", verbosity="low",
        extra_body={"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                    "separate_reasoning": True, "return_hidden_states": False})
    assert r.choices[0].message.content == plain
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens


def test_sdk_completions_with_every_argument(client, srv):
    native = requests.post(srv.url + "/generate", json={"text": "1 2 3", "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 3}}).json()
    r = client.completions.create(
        model="m", prompt="1 2 3", best_of=1, echo=False, frequency_penalty=0.0, logit_bias={},
        logprobs=1, max_tokens=3, n=1, presence_penalty=0, seed=2, stop=None, stream=False,
        suffix=None, temperature=0.0, top_p=1.0, user="u",
        extra_body={"ignore_eos": False, "json_schema": None, "custom_labels": {"team": "rl"}})
    assert r.choices[0].text == native["text"]


def test_stream_options_usage(client):
    chunks = list(client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=5, temperature=0.0, n=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *content, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 10  # 2 samples x 5 tokens
    assert all(c.usage is None for c in content)
    steps = [c for c in client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=3, temperature=0.0, stream=True,
        stream_options={"continuous_usage_stats": True}, extra_body={"ignore_eos": True})]
    assert [c.usage.completion_tokens for c in steps] == [1, 2, 3]


REFUSED = [
    ({"presence_penalty": 0.1}, "presence_penalty=0.1 is not supported by this server: penalties"),
    ({"frequency_penalty": -0.5}, "frequency_penalty=-0.5 is not supported"),
    ({"repetition_penalty": 1.1}, "repetition_penalty=1.1 is not supported"),
    ({"logit_bias": {"x": 1}}, "logit_bias: 'x': 1 is not a token id and a number"),
    ({"response_format": {"type": "json_object"}}, "constrained decoding"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice='required' needs the server started with --tool-call-parser"),
    ({"tools": [{"type": "function"}]}, "tools must be a list of"),
    ({"stream_options": {"include_usage": True}}, "stream_options is only allowed when stream"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort must be one of"),
    ({"functions": [{"name": "f"}]}, "legacy functions API"),
    ({"user": 5}, "user must be str"),
]


@pytest.mark.parametrize("extra,message", REFUSED, ids=[m[:28] for _, m in REFUSED])
def test_non_neutral_values_are_refused_with_why(srv, extra, message):
    r = _chat(srv, max_tokens=2, **extra)
    assert r.status_code == 400 and message in r.json()["message"], r.text


def test_logit_bias_through_the_sdk(client, srv):
    r = client.completions.create(model="m", prompt="1 2 3", max_tokens=3, temperature=0.0,
                                  logit_bias={"7": 100})
    assert r.choices[0].text == srv.engine.tokenizer.decode([7, 7, 7])


def test_tools_reach_the_template(client, srv):
    tok = srv.engine.tokenizer
    with_tools = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                         tokenize=False)
    assert "TOOLS" in with_tools  # the reference template really renders them
    expected = len(tok.encode(with_tools, add_special_tokens=False))
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1, tools=TOOLS,
                                       tool_choice="auto")
    assert r.usage.prompt_tokens == expected
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1, tools=TOOLS,
                                       tool_choice="none")
    assert r.usage.prompt_tokens < expected


def test_reasoning_effort_switches_thinking(client, srv):
    tok = srv.engine.tokenizer
    off = tok.apply_chat_template(MESSAGES, enable_thinking=False, add_generation_prompt=True,
                                  tokenize=False)
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1,
                                       reasoning_effort="none")
    assert r.usage.prompt_tokens == len(tok.encode(off, add_special_tokens=False))
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1,
                                       reasoning_effort="high")
    assert r.usage.prompt_tokens < len(tok.encode(off, add_special_tokens=False))


def test_max_tokens_past_the_context(client, srv):
    ctx = srv.engine.max_seq_len
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=ctx)
    assert (f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {ctx + 3} tokens: 3 tokens from the input messages and "
            f"{ctx} tokens for the completion.") in e.value.message
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10**9)
    r = client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=ctx - 4, temperature=0.0)  # fits
    assert r.choices[0].finish_reason in ("length", "stop")


def test_rid_names_the_request(srv):
    r = requests.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                          "rid": "my-request"})
    assert r.status_code == 200
    r = requests.post(srv.url + "/v1/completions", json={"prompt": "hi", "rid": 3})
    assert r.status_code == 400 and "rid must be a string" in r.json()["message"]
