"""The official openai client against /v1, and the launch_server CLI as a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import requests

openai = pytest.importorskip("openai")  # the GPU machine has no openai SDK


@pytest.fixture(scope="module")
def client(serve):
    srv = serve("qwen2.5")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none"), srv


def test_completions(client, prompts):
    c, srv = client
    r = c.completions.create(model="m", prompt=prompts[0], max_tokens=7, temperature=0.0,
                             extra_body={"ignore_eos": True})
    native = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True}}).json()
    assert r.choices[0].text == native["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens == native["meta_info"]["prompt_tokens"]
    r = c.completions.create(model="m", prompt=[prompts[0], prompts[1]], max_tokens=3, temperature=0.0,
                             logprobs=2, extra_body={"ignore_eos": True})
    assert len(r.choices) == 2
    assert len(r.choices[0].logprobs.token_logprobs) == 3 and len(r.choices[0].logprobs.top_logprobs[0]) <= 2
    chunks = list(c.completions.create(model="m", prompt=prompts[0], max_tokens=7, temperature=0.0,
                                       stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == native["text"]
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="m", prompt=prompts[0], max_tokens=-1)


def test_chat_completions(client):
    c, srv = client
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    r = c.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0.0,
                                  logprobs=True, top_logprobs=2)
    ids = srv.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    native = requests.post(srv.url + "/generate", json={"text": ids, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 6}}).json()
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == native["text"]
    assert len(r.choices[0].logprobs.content) == len(native["output_ids"])
    chunks = list(c.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0.0,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == native["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    models = c.models.list()
    assert models.data[0].id == srv.engine.args.model_path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_server_cli(tiny_models, wait_healthy):
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_kvc.launch_server", "--model-path", str(tiny_models["llama3"]),
         "--port", str(port), "--dtype", "float32", "--max-total-tokens", "2048",
         "--max-running-requests", "8", "--context-length", "512", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=120)
        info = requests.get(url + "/get_server_info").json()
        assert info["max_total_num_tokens"] == 2048 and info["context_length"] == 512
        assert info["resolved_dtype"] == "float32"
        r = requests.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_rejects_bad_args(tiny_models):
    r = subprocess.run([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                        str(tiny_models["llama3"]), "--page-size", "4"], capture_output=True, text=True)
    assert r.returncode != 0 and "--page-size" in r.stderr
