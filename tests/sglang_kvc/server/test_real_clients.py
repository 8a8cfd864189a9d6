"""Clients nobody here wrote, against servers started as users start them: two
``python -m sglang_kvc.launch_server`` processes (dense and R-KV) behind ``sglang-router`` (round
robin), the ``openai`` SDK, ``lm-eval``'s ``local-completions`` model, and ``evaluation/eval.sh``.
Answers are checked against Hugging Face on the same tiny checkpoint (fp32, CPU). The servers run
on the CPU, or on a GPU with KVC_TEST_SERVER_DEVICE=cuda."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

from checkpoint_tools.cpu_megatron import free_port

ROOT = Path(__file__).resolve().parents[3]
# KVC_TEST_SERVER_DEVICE=cuda runs the same servers on a GPU (fp32, CUDA graphs and Triton
# kernels on), still checked against HF on the CPU.
SERVER_DEVICE = os.environ.get("KVC_TEST_SERVER_DEVICE", "cpu")
pytest.importorskip("sglang_router")
pytestmark = pytest.mark.launch  # servers and clients as users start them: run by .ci/run
openai = pytest.importorskip("openai")


def _wait(url: str, procs: list, timeout: float = 120) -> None:
    """Until ``url`` answers 200 (the router's /v1/models: it has no engine's /health)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args} exited with {p.returncode}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.fixture(scope="module")
def cluster(tiny_models, tmp_path_factory, wait_healthy):
    """(router URL, dense server URL, R-KV server URL, model dir, log dir)."""
    model, logs = tiny_models["qwen2.5"], tmp_path_factory.mktemp("cluster")
    ports = [free_port() for _ in range(3)]
    server = [sys.executable, "-m", "sglang_kvc.launch_server", "--model-path", str(model),
              "--device", SERVER_DEVICE, "--dtype", "float32", "--max-total-tokens", "4096",
              "--host", "127.0.0.1"]
    procs = [_start(server + ["--port", str(ports[1])], logs / "dense.log"),
             _start(server + ["--port", str(ports[2]), "--compress-algorithm", "rkv",
                              "--compress-max-prompt", "8", "--compress-max-window", "2",
                              "--compress-divide-length", "2"], logs / "rkv.log")]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url, proc in zip(urls[1:], procs):
            wait_healthy(url, proc, timeout=120)
        procs.append(_start([*_router_cli(), "launch", "--worker-urls", *urls[1:], "--policy", "round_robin",
                             "--host", "127.0.0.1", "--port", str(ports[0]), "--prometheus-host",
                             "127.0.0.1", "--prometheus-port", str(free_port())], logs / "router.log"))
        _wait(urls[0] + "/v1/models", procs)
        _wait_for_workers(urls[0])
        yield (*urls, model, logs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _router_cli() -> list[str]:
    """The ``sglang-router`` console script of this environment (as users run it)."""
    beside = Path(sys.executable).with_name("sglang-router")
    return [str(beside)] if beside.is_file() else [shutil.which("sglang-router") or "sglang-router"]


def _wait_for_workers(router: str, timeout: float = 60) -> None:
    """The router serves /v1/models before its workers are registered: wait for a generate."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = requests.post(router + "/generate", json={"text": "1", "sampling_params": {
            "max_new_tokens": 1}}, timeout=30)
        if r.status_code == 200:
            return
        time.sleep(1)
    raise TimeoutError(f"router {router} never forwarded a /generate: {r.status_code} {r.text[:200]}")


def _greedy(params=None, **body):
    return {"sampling_params": {"max_new_tokens": 8, "temperature": 0, **(params or {})}, **body}


@pytest.fixture(scope="module")
def hf(cluster):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = cluster[3]
    return (AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(model_dir))


def _hf_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


# --------------------------------------------------------------------------- sglang-router

def test_router_generate_single_batch_and_stream(cluster):
    router, dense, rkv, _, logs = cluster
    direct = requests.post(dense + "/generate", json=_greedy(text="add 1 2")).json()
    outs = [requests.post(router + "/generate", json=_greedy(text="add 1 2")) for _ in range(4)]
    assert all(r.status_code == 200 for r in outs), [r.text for r in outs]
    served = [("compression" in r.json()["meta_info"]) for r in outs]
    assert sorted(served) == [False, False, True, True]  # round robin over dense and R-KV
    for r, compressed in zip(outs, served):
        if not compressed:  # the dense worker answers through the router as it does directly
            assert r.json()["output_ids"] == direct["output_ids"]
    batch = requests.post(router + "/generate", json=_greedy(input_ids=[[5, 6, 7], [8, 9]]))
    assert batch.status_code == 200 and len(batch.json()) == 2
    assert [o["meta_info"]["prompt_tokens"] for o in batch.json()] == [3, 2]
    with requests.post(router + "/generate", json=_greedy(text="add 1 2", stream=True),
                       stream=True, timeout=60) as r:
        events = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data:"):])
    assert last["meta_info"]["finish_reason"]["type"] == "length" and len(last["output_ids"]) == 8
    ignored = (logs / "dense.log").read_text() + (logs / "rkv.log").read_text()
    assert "accepting and ignoring request field(s)" in ignored and "model" in ignored


def test_router_chat_completions_with_the_openai_sdk(cluster):
    client = openai.OpenAI(base_url=cluster[0] + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=6, n=2, logprobs=True, top_logprobs=2)
    assert len(reply.choices) == 2
    assert all(len(c.logprobs.content) == reply.usage.completion_tokens // 2 for c in reply.choices)
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                 "content": "hi"}], max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


def test_generate_accepts_client_fields_and_refuses_wrong_values(cluster):
    dense = cluster[1]
    router_fields = {"model": "tiny", "background": False, "no_logs": False, "return_bytes": False,
                     "return_entropy": False, "log_metrics": True, "priority": 3}
    ok = requests.post(dense + "/generate", json=_greedy(text="add 1 2", **router_fields))
    assert ok.status_code == 200, ok.text
    for bad, message in [({"model": 5}, "model must be str"),
                         ({"background": "yes"}, "background must be bool"),
                         ({"priority": True}, "priority must be int"),
                         ({"return_entropy": True}, "return_entropy=True is not supported"),
                         ({"image_data": "x.png"}, "image_data='x.png' is not supported"),
                         ({"colour": 1}, "unknown request field(s): colour")]:
        r = requests.post(dense + "/generate", json=_greedy(text="add 1 2", **bad))
        assert r.status_code == 400 and message in r.json()["error"]["message"], (bad, r.text)
    again = requests.post(dense + "/generate", json=_greedy(text="add 1 2"))  # still serving
    assert again.status_code == 200 and again.json()["output_ids"] == ok.json()["output_ids"]


def test_generate_prompt_logprobs_match_hf(cluster, hf):
    model, tok = hf
    ids = tok("add 12 and 30, then box it", add_special_tokens=False)["input_ids"]
    out = requests.post(cluster[1] + "/generate", json=_greedy(
        {"max_new_tokens": 0}, input_ids=ids, return_logprob=True, logprob_start_len=0)).json()
    entries = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in entries] == ids and entries[0][0] is None
    torch.testing.assert_close(torch.tensor([lp for lp, _, _ in entries[1:]], dtype=torch.float64),
                               torch.tensor(_hf_logprobs(model, ids), dtype=torch.float64), atol=1e-4, rtol=0)
    out = requests.post(cluster[1] + "/generate", json=_greedy(
        {"max_new_tokens": 2}, input_ids=ids, return_logprob=True, logprob_start_len=3)).json()
    assert [t for _, t, _ in out["meta_info"]["input_token_logprobs"]] == ids[3:]


# --------------------------------------------------------------------------- openai SDK

def test_openai_sdk_completions(cluster, hf):
    model, tok = hf
    client = openai.OpenAI(base_url=cluster[1] + "/v1", api_key="none", max_retries=0)
    assert client.models.list().data[0].id
    plain = client.completions.create(model="tiny", prompt="add 1 2", max_tokens=6, temperature=0)
    assert plain.usage.completion_tokens == 6
    stop = plain.choices[0].text[1:2]
    if stop:  # a stop string from inside the greedy text cuts it there (and is trimmed)
        stopped = client.completions.create(model="tiny", prompt="add 1 2", max_tokens=12,
                                            temperature=0, stop=[stop])
        text = plain.choices[0].text
        assert stopped.choices[0].text == text[:text.index(stop)]
        assert stopped.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="add 1 2", max_tokens=6, temperature=0, stream=True))
    assert streamed == plain.choices[0].text
    prompt = "add 12 and 30"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    for max_tokens in (0, 3):
        echo = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                         temperature=0, echo=True, logprobs=1)
        choice = echo.choices[0]
        assert choice.text.startswith(prompt) and len(choice.logprobs.tokens) == len(ids) + max_tokens
        assert choice.logprobs.token_logprobs[0] is None
        want = _hf_logprobs(model, ids + ([] if max_tokens == 0 else
                                          tok(choice.text[len(prompt):], add_special_tokens=False)["input_ids"]))
        torch.testing.assert_close(torch.tensor(choice.logprobs.token_logprobs[1:len(ids)], dtype=torch.float64),
                                   torch.tensor(want[:len(ids) - 1], dtype=torch.float64), atol=1e-4, rtol=0)
        assert choice.logprobs.text_offset[:2] == [0, len(choice.logprobs.tokens[0])]
        assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs[1:])
    with pytest.raises(openai.BadRequestError, match="echo is not supported together with stream"):
        client.completions.create(model="tiny", prompt=prompt, echo=True, stream=True)


# --------------------------------------------------------------------------- lm-evaluation-harness

TASKS = {
    "tiny_arith_gen": {"output_type": "generate_until",
                       "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
                       "doc_to_target": "{{answer}}", "metric_list": [{"metric": "exact_match"}]},
    "tiny_arith_mc": {"output_type": "multiple_choice", "doc_to_choice": "{{choices}}",
                      "doc_to_target": "gold", "metric_list": [{"metric": "acc"}]},
}


def _lm_eval(tmp_path: Path, base_url: str, tokenizer: Path, tokenized: bool) -> dict:
    """Run the lm-eval CLI on both offline tasks; {task: [sample rows]}."""
    pytest.importorskip("lm_eval")
    import yaml

    rows = [{"question": f"What is {a} plus {b}?", "answer": str(a + b),
             "choices": [str(a + b), str(a + b + 1), str(a * b + 7)], "gold": 0}
            for a, b in [(1, 2), (3, 4), (5, 6)]]
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, spec in TASKS.items():
        task = {"task": name, "dataset_path": "json", "test_split": "test",
                "dataset_kwargs": {"data_files": {"test": str(data)}},
                "doc_to_text": "Question: {{question}}\nAnswer:", **spec}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(task))
    args = (f"model=tiny,base_url={base_url}/v1/completions,tokenizer_backend=huggingface,"
            f"tokenizer={tokenizer},num_concurrent=1,max_retries=1,tokenized_requests={tokenized}")
    proc = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions",
                           "--model_args", args, "--tasks", ",".join(TASKS), "--include_path",
                           str(tmp_path), "--output_path", str(tmp_path / "out"), "--log_samples"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: [json.loads(line) for f in (tmp_path / "out").rglob(f"samples_{name}_*.jsonl")
                   for line in f.read_text().splitlines()] for name in TASKS}


def test_lm_eval_local_completions(cluster, hf, tmp_path):
    """Loglikelihoods (echo + logprobs) equal HF's sum over the continuation tokens, and the
    generate_until answers equal HF's greedy text, both as lm-eval itself tokenizes."""
    model, tok = hf
    samples = _lm_eval(tmp_path, cluster[1], cluster[3], tokenized=True)
    assert len(samples["tiny_arith_mc"]) == 3 and len(samples["tiny_arith_gen"]) == 3
    for s in samples["tiny_arith_mc"]:
        for args, resp in zip(s["arguments"].values(), s["filtered_resps"]):
            context, continuation = args["arg_0"], args["arg_1"]
            whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
            ctxlen = len(tok(context, add_special_tokens=False)["input_ids"])
            want = sum(_hf_logprobs(model, whole)[ctxlen - 1:])
            assert abs(float(resp[0]) - want) < 1e-3, (context, continuation, resp, want)
    for s in samples["tiny_arith_gen"]:
        ids = tok(s["arguments"]["gen_args_0"]["arg_0"], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):]
        text = tok.decode(out).split("\n")[0]
        assert s["filtered_resps"][0] == text


def test_lm_eval_through_the_router(cluster, tmp_path):
    """The router takes only text prompts for /v1/completions: lm-eval's tokenized_requests=False."""
    samples = _lm_eval(tmp_path, cluster[0], cluster[3], tokenized=False)
    assert all(len(rows) == 3 for rows in samples.values())
    assert all(float(r[0]) < 0 for s in samples["tiny_arith_mc"] for r in s["filtered_resps"])


# --------------------------------------------------------------------------- evaluation/eval.sh

def test_eval_sh_against_the_router(cluster, tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                             for i in range(3)))
    proc = subprocess.run(["bash", str(ROOT / "evaluation" / "eval.sh"), "--url", cluster[0],
                           "--benchmarks", str(bench), "--max-tokens", "8", "--n-samples", "2",
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "bench" / "metrics.json").read_text())
    assert metrics["generation_errors"] == 0, metrics
    rows = [json.loads(x) for x in (tmp_path / "out" / "bench" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["completions"]) == 2 for r in rows)
