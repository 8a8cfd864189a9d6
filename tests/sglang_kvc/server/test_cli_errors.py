"""launch_server fails in one line on a wrong model path, device or flag (never a hub lookup),
and exits within seconds of SIGTERM while it is generating for many clients."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import requests

from tests.sglang_kvc.conftest import free_port

CLI = [sys.executable, "-m", "sglang_kvc.launch_server"]


def _fails_in_one_line(args, must_name, cwd=None):
    t0 = time.time()
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, cwd=cwd,
                       env=dict(os.environ, HF_HUB_OFFLINE="0"))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and must_name in lines[0], r.stderr
    assert "Traceback" not in r.stderr and time.time() - t0 < 60  # no hub retries
    return lines[0]


def test_missing_model_path(tmp_path):
    line = _fails_in_one_line(["--model-path", "/nonexistent"], "--model-path /nonexistent")
    assert "no such directory" in line


def test_relative_missing_model_path_never_reaches_a_hub(tmp_path):
    line = _fails_in_one_line(["--model-path", "models/SmolLM2"], "--model-path models/SmolLM2",
                              cwd=tmp_path)
    assert "no such directory" in line


def test_directory_without_config(tmp_path):
    _fails_in_one_line(["--model-path", str(tmp_path)], "no config.json there")


def test_broken_checkpoint_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-family"}')
    _fails_in_one_line(["--model-path", str(tmp_path), "--device", "cpu"], str(tmp_path))


def test_wrong_device(tiny_models):
    path = str(tiny_models["llama3"])
    _fails_in_one_line(["--model-path", path, "--device", "tpu"], "--device tpu")
    import torch
    if not torch.cuda.is_available():
        _fails_in_one_line(["--model-path", path, "--device", "cuda"], "--device cuda")


def test_abbreviated_flag_is_refused(tiny_models):
    _fails_in_one_line(["--model-path", str(tiny_models["llama3"]), "--max-running", "4"],
                       "--max-running")


def test_sigterm_under_load_exits_promptly(tiny_models, wait_healthy):
    """~12 s on 2 CPU cores."""
    port = free_port()
    proc = subprocess.Popen(CLI + ["--model-path", str(tiny_models["llama3"]), "--port", str(port),
                                   "--device", "cpu", "--max-total-tokens", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=120)
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 100000, "n": 64,
                                                     "ignore_eos": True}}
        # Paused while the 8 requests queue, so none can finish first on a fast machine; then
        # running: a request's 64 samples need 8 waves of ~500 steps in this pool before it
        # could finish, far more than the signal takes.
        requests.post(url + "/pause_generation", json={})
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(_post, url, body) for _ in range(8)]
            # each request queued (64 samples) or refused (503: over --max-queued-tokens)
            _wait_info(url, lambda i: i["num_waiting_reqs"] + 64 * sum(f.done() for f in futs) == 8 * 64)
            requests.post(url + "/continue_generation", json={})
            _wait_info(url, lambda i: i["num_running_reqs"] > 0)
            t0 = time.time()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            assert time.time() - t0 < 10
            outcomes = [f.result(timeout=30) for f in futs]
        assert all(o in ("abort", "closed", 503) for o in outcomes), outcomes
        assert "Traceback" not in proc.stdout.read()
    finally:
        proc.kill()


def _post(url, body):
    try:
        r = requests.post(url + "/generate", json=body, timeout=60)
    except requests.ConnectionError:
        return "closed"
    if r.status_code != 200:
        return r.status_code
    return r.json()[0]["meta_info"]["finish_reason"]["type"]


def _wait_info(url, cond, timeout=60.0):
    deadline = time.time() + timeout
    while not cond(requests.get(url + "/get_server_info").json()):
        assert time.time() < deadline, "the server never reached the expected state"
        time.sleep(0.05)

