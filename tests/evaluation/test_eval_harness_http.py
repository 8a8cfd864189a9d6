"""The eval harness's HTTP client paths against a deterministic protocol test double.

``FakeMathServer`` is a protocol test double, not a model: a tiny FastAPI app that speaks the
shapes of SGLang ``POST /generate`` and OpenAI ``/v1/completions`` / ``/v1/chat/completions``
and answers each question with a scripted completion chosen by the request's seed. The checks
are the files, fields and counts the harness writes, and that correct answers are scored
correct (metrics against values computed by hand from the script).
"""

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from evaluation.metrics import pass_at_k
from evaluation.run_eval import EvalConfig, parse_args, run

N = 4
QUESTIONS = [
    # question, gold, how the scripted server answers sample j (seed parity = j parity)
    ("What is 2+3?", "5", "always"),
    ("What is half of one?", "\\frac{1}{2}", "even"),
    ("What is 7*100?", "700", "never"),      # answers 7: the x100 pitfall must score it wrong
    ("What is 10-1?", "9", "truncated"),     # runs out of tokens without an answer
]


def scripted_completion(prompt_text: str, seed: int) -> tuple[str, str]:
    for question, gold, mode in QUESTIONS:
        if question in prompt_text:
            break
    else:
        return "I do not know.", "stop"
    j = seed % N
    if mode == "always" or (mode == "even" and j % 2 == 0):
        return f"Let me think. The result is \\boxed{{{gold}}}.", "stop"
    if mode == "truncated":
        return "Let me think about this for a very long", "length"
    return "I believe the answer is \\boxed{7}.", "stop"


class FakeMathServer:
    """Protocol test double for SGLang /generate and OpenAI completions (see module docstring)."""

    def __init__(self, fail_first: int = 0):
        self.app = FastAPI()
        self.requests: list[tuple[str, dict]] = []
        self.fail_first = fail_first  # answer this many generation requests with HTTP 503 first
        app = self.app

        def _fail(path: str, body: dict):
            self.requests.append((path, body))
            if self.fail_first > 0:
                self.fail_first -= 1
                return JSONResponse({"error": {"message": "warming up"}}, status_code=503)
            return None

        @app.get("/get_model_info")
        async def model_info():
            return {"model_path": "fake", "tokenizer_path": "fake", "is_generation": True}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            if (failed := _fail("/generate", body)) is not None:
                return failed
            params = body["sampling_params"]
            text, reason = scripted_completion(body["text"], params.get("sampling_seed", 0))
            finish = {"type": "stop", "matched": "<|im_end|>"} if reason == "stop" else \
                {"type": "length", "length": params["max_new_tokens"]}
            return {"text": text, "output_ids": list(range(len(text.split()))),
                    "meta_info": {"id": "r", "prompt_tokens": 10, "completion_tokens": len(text.split()),
                                  "finish_reason": finish}}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            if (failed := _fail("/v1/completions", body)) is not None:
                return failed
            text, reason = scripted_completion(body["prompt"], body.get("seed", 0))
            return {"id": "c", "object": "text_completion", "model": body["model"],
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split()),
                              "total_tokens": 10 + len(text.split())}}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            if (failed := _fail("/v1/chat/completions", body)) is not None:
                return failed
            prompt = "\n".join(m["content"] for m in body["messages"])
            text, reason = scripted_completion(prompt, body.get("seed", 0))
            return {"id": "c", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": reason}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split()),
                              "total_tokens": 10 + len(text.split())}}

    def __enter__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture()
def bench_file(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": g}) + "\n" for q, g, _ in QUESTIONS))
    return path


def expected_metrics():
    correct = {"always": N, "even": N // 2, "never": 0, "truncated": 0}
    counts = [correct[mode] for _, _, mode in QUESTIONS]
    avg = 100.0 * sum(counts) / (N * len(QUESTIONS))
    passes = {str(k): round(100.0 * sum(pass_at_k(N, c, k) for c in counts) / len(counts), 2) for k in (1, 2, 4)}
    return avg, passes


def make_config(url, bench_file, out, backend, **kw):
    return EvalConfig(url=url, benchmarks=[str(bench_file)], output_dir=out, backend=backend, n_samples=N,
                      concurrency=8, progress=False, grader_workers=1, retry_backoff=0.01, **kw)


@pytest.mark.parametrize("backend,path", [("sglang", "/generate"), ("openai", "/v1/completions"),
                                          ("openai-chat", "/v1/chat/completions"), ("auto", "/generate")])
def test_backend_paths_files_fields_counts(tmp_path, bench_file, backend, path):
    out = tmp_path / "out"
    with FakeMathServer(fail_first=2) as server:
        metrics = asyncio.run(run(make_config(server.url, bench_file, out, backend)))
        gen_requests = [r for r in server.requests]
    assert {p for p, _ in gen_requests} == {path}
    assert len(gen_requests) == len(QUESTIONS) * N + 2  # two 503s were retried
    body = gen_requests[-1][1]
    if path == "/generate":
        assert body["sampling_params"]["temperature"] == 0.8 and body["sampling_params"]["top_p"] == 0.95
        assert body["sampling_params"]["stop"] == ["<|im_end|>", "<|endoftext|>"]
        assert body["text"].startswith("<|im_start|>system\nYou are a helpful assistant.")
    else:
        assert body["model"] == "fake-model" and body["temperature"] == 0.8 and body["top_p"] == 0.95
    if path == "/v1/chat/completions":
        assert body["messages"][-1]["role"] == "user" and "\\boxed{}" in body["messages"][-1]["content"]

    rows = [json.loads(line) for line in (out / "toy" / "samples.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in rows] == list(range(len(QUESTIONS)))
    for row, (question, gold, mode) in zip(rows, QUESTIONS):
        assert row["question"] == question and row["gold"] == gold
        for key in ("completions", "extracted", "scores", "finish_reasons", "response_tokens", "grader_timeouts"):
            assert len(row[key]) == N, key
        if mode == "always":
            assert row["scores"] == [True] * N and row["extracted"] == [gold] * N
        if mode == "even":
            assert row["scores"] == [True, False, True, False]
        if mode == "never":
            assert row["scores"] == [False] * N and row["extracted"] == ["7"] * N
        if mode == "truncated":
            assert row["finish_reasons"] == ["length"] * N and row["extracted"] == [None] * N
    saved = json.loads((out / "toy" / "metrics.json").read_text())
    avg, passes = expected_metrics()
    assert saved[f"avg@{N}"] == pytest.approx(avg) and saved["accuracy"] == pytest.approx(avg)
    assert saved["pass@k"] == pytest.approx(passes)
    assert saved["truncation_ratio"] == pytest.approx(0.25)
    assert saved["num_problems"] == len(QUESTIONS) and saved["n_samples"] == N
    assert saved["mean_response_tokens"] > 0 and saved["grader_timeouts"] == 0
    assert metrics["toy"]["pass@k"] == saved["pass@k"]
    summary = (out / "summary.md").read_text()
    assert "| toy | 4 | 4 |" in summary and "pass@4" in summary and "**average**" in summary
    assert not (out / "toy" / "samples.partial.jsonl").exists()


def test_skip_finished_resume_partial_and_overwrite(tmp_path, bench_file):
    out = tmp_path / "out"
    with FakeMathServer() as server:
        config = make_config(server.url, bench_file, out, "sglang")
        asyncio.run(run(config))
        first = len(server.requests)
        assert first == len(QUESTIONS) * N
        asyncio.run(run(config))  # finished: skipped, no requests
        assert len(server.requests) == first

        # an interrupted run: metrics missing, two problems already generated
        rows = [json.loads(line) for line in (out / "toy" / "samples.jsonl").read_text().splitlines()]
        (out / "toy" / "metrics.json").unlink()
        with open(out / "toy" / "samples.partial.jsonl", "w") as f:
            for row in rows[:2]:
                f.write(json.dumps({k: row[k] for k in ("idx", "question", "gold", "completions",
                                                        "finish_reasons", "response_tokens")}) + "\n")
        asyncio.run(run(config))
        assert len(server.requests) == first + 2 * N
        resumed = json.loads((out / "toy" / "metrics.json").read_text())
        assert resumed[f"avg@{N}"] == pytest.approx(expected_metrics()[0])

        # a changed setting refuses to mix with the partial file
        (out / "toy" / "metrics.json").unlink()
        (out / "toy" / "samples.partial.jsonl").write_text(json.dumps(rows[0]) + "\n")
        changed = make_config(server.url, bench_file, out, "sglang", temperature=0.3)
        with pytest.raises(ValueError, match="--overwrite"):
            asyncio.run(run(changed))

        overwrite = make_config(server.url, bench_file, out, "sglang", overwrite=True)
        asyncio.run(run(overwrite))
        assert len(server.requests) == first + 2 * N + len(QUESTIONS) * N


def test_unreachable_server_is_a_clear_error(tmp_path, bench_file):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = make_config(f"http://127.0.0.1:{port}", bench_file, tmp_path / "out", "auto")
    with pytest.raises(Exception, match="no SGLang"):
        asyncio.run(run(config))


def test_cli_defaults():
    config = parse_args(["--url", "http://x", "--output-dir", "o", "--benchmarks", "math500,aime24,amc23"])
    assert (config.temperature, config.top_p) == (0.8, 0.95)
    assert [config.samples_for(b) for b in config.benchmarks] == [1, 32, 32]
    assert parse_args(["--url", "u", "--output-dir", "o", "--n-samples", "4"]).samples_for("aime24") == 4
