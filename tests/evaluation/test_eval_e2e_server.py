"""End to end: a tiny random model served by sglang-kvc, scored by the harness over HTTP.

Accuracy is near zero by construction (random weights); the test checks files, fields and
counts on both the SGLang ``/generate`` and the OpenAI ``/v1/completions`` paths.
"""

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

if importlib.util.find_spec("sglang_kvc") is None or importlib.util.find_spec("sglang_kvc.launch_server") is None:
    pytest.skip("sglang_kvc.launch_server is not importable (rollout server not built yet)", allow_module_level=True)

from evaluation.run_eval import EvalConfig, run  # noqa: E402

QUESTIONS = [("What is 2+3?", "5"), ("What is 12 * 12?", "144"), ("Compute 3 + 4.", "7")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_tiny_model(tmp_path_factory):
    from checkpoint_tools.tiny_models import make_tiny_model

    model_dir = make_tiny_model("qwen2.5", tmp_path_factory.mktemp("tiny-qwen"))
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_kvc.launch_server", "--model-path", str(model_dir),
             "--port", str(port), "--host", "127.0.0.1"],
            stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/get_model_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server did not come up in 240 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_eval_against_served_tiny_model(served_tiny_model, tmp_path, backend):
    bench = tmp_path / "toy.jsonl"
    bench.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    out = tmp_path / "out"
    config = EvalConfig(url=served_tiny_model, benchmarks=[str(bench)], output_dir=out, backend=backend,
                        n_samples=2, max_tokens=16, concurrency=4, progress=False, grader_workers=1)
    metrics = asyncio.run(run(config))["toy"]
    rows = [json.loads(line) for line in (out / "toy" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == len(QUESTIONS)
    for row, (question, gold) in zip(rows, QUESTIONS):
        assert row["question"] == question and row["gold"] == gold
        assert len(row["completions"]) == len(row["scores"]) == len(row["extracted"]) == 2
        assert all(isinstance(c, str) for c in row["completions"])
        assert set(row["finish_reasons"]) <= {"stop", "length"}
        assert all(t is None or 0 <= t <= 16 for t in row["response_tokens"])
    assert metrics["num_problems"] == 3 and metrics["n_samples"] == 2 and metrics["num_scores"] == 6
    assert 0.0 <= metrics["avg@2"] <= 100.0 and set(metrics["pass@k"]) == {"1", "2"}
    assert metrics["generation_errors"] == 0
    assert (out / "summary.md").read_text().startswith("| benchmark |")
