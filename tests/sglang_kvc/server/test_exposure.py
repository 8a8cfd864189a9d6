"""Exposing the server: `--api-key` as SGLang's (a bearer token on every route but /health), the
key never echoed by /get_server_info, a port already taken reported before the model loads, a
warning for a non-loopback host without a key, and Ctrl-C ending in one line.

Mutation checks: exempting every path in auth._exempt fails test_api_key_guards_every_route_but
_health; binding after the Engine is built in launch_server.main fails
test_port_in_use_fails_before_the_model_loads (the KV-pool line appears)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.sglang_kvc.conftest import free_port
from tests.sglang_kvc.hold import hold_when_running, num_requests, raw_post, wait_until

openai = pytest.importorskip("openai")  # the GPU machine has no openai SDK

CLI = [sys.executable, "-m", "sglang_kvc.launch_server"]
KEY = "sekret-123"


@pytest.fixture(scope="module")
def srv(serve):
    return serve("qwen2.5", api_key=KEY)


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path,body", [
    ("post", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    ("get", "/get_server_info", None), ("get", "/v1/models", None),
    ("post", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("post", "/flush_cache", None), ("post", "/update_weights_from_disk", {"model_path": "x"}),
])
def test_api_key_guards_every_route_but_health(srv, method, path, body):
    call = getattr(requests, method)
    for headers in ({}, _auth("wrong"), {"Authorization": KEY}):  # no key, wrong key, no "Bearer"
        r = call(srv.url + path, json=body, headers=headers)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, (headers, r.text)
    r = call(srv.url + path, json=body, headers=_auth(KEY))
    assert r.status_code != 401, r.text


def test_health_and_preflight_stay_open(srv):
    assert requests.get(srv.url + "/health").status_code == 200
    assert requests.get(srv.url + "/health_generate").status_code == 200
    assert requests.options(srv.url + "/generate").status_code != 401


def test_openai_sdk_sends_the_key(srv):
    ok = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    assert ok.completions.create(model="m", prompt="hi", max_tokens=2).usage.completion_tokens <= 2
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt="hi", max_tokens=2)


def test_server_info_hides_the_key(srv):
    info = requests.get(srv.url + "/get_server_info", headers=_auth(KEY)).json()
    assert info["api_key"] == "<set>" and KEY not in str(info)


def test_disconnect_still_aborts_behind_the_key(srv):
    """The middleware is plain ASGI: the handler still sees the client leave. The engine is held
    once the request runs, so only the disconnect's abort can end it (whatever the speed)."""
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}
    with hold_when_running(srv.engine):
        s = raw_post(srv.url, "/generate", json.dumps(body).encode(), headers=_auth(KEY))
        wait_until(lambda: srv.engine.get_server_info()["num_running_reqs"] == 1, what="running")
        s.close()
        wait_until(lambda: num_requests(srv.engine) == 0, what="the request aborted")


def test_port_in_use_fails_before_the_model_loads(tiny_models):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(CLI + ["--model-path", str(tiny_models["llama3"]), "--device", "cpu",
                                  "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--port {port}: cannot bind" in lines[0], r.stderr
    assert "KV pool" not in r.stderr  # the model was never loaded


@pytest.mark.launch
def test_open_host_warns_and_ctrl_c_is_one_line(tiny_models, wait_healthy):
    """~15 s: a server on 0.0.0.0 without a key warns; SIGINT under load ends in one line, exit
    status 130, no traceback."""
    port = free_port()
    proc = subprocess.Popen(CLI + ["--model-path", str(tiny_models["llama3"]), "--device", "cpu",
                                   "--host", "0.0.0.0", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=120)
        # Paused: the request stays in flight until the signal by construction (the tiny model's
        # context caps a 100,000-token answer at ~510 tokens, under 2 s on a fast machine).
        requests.post(url + "/pause_generation", json={}, timeout=30)
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}
        subprocess.Popen([sys.executable, "-c", f"import requests; requests.post({url + '/generate'!r}, "
                          f"json={body!r}, timeout=60)"], stderr=subprocess.DEVNULL)
        wait_until(lambda: _held(url) == 1, what="the request queued behind the pause")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out
    assert "without --api-key" in out and "Traceback" not in out
    # the test's own control requests are access-log lines; what the signal prints is one line
    after = [line for line in out[out.index("GET /health"):].splitlines()[1:]
             if not any(f'"{verb} /{path}' in line for verb, path in _CONTROL)]
    assert len(after) == 1 and after[0].startswith("python -m sglang_kvc.launch_server: stopped by "
                                                   "SIGINT"), out


_CONTROL = (("POST", "pause_generation"), ("GET", "get_server_info"))


def _held(url: str) -> int:
    info = requests.get(url + "/get_server_info", timeout=10).json()
    return info["num_running_reqs"] + info["num_waiting_reqs"]
