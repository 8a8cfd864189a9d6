"""The launch users run: ``scripts/run-*.sh`` -> ``torch.distributed.run`` -> ``trainer.train``
on gloo ranks, each hosting its own rollout engine; and rendezvous failures that end with a
message instead of a hang. Every run is under a timeout, so a broken launch fails CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from checkpoint_tools import cpu_megatron

pytestmark = pytest.mark.launch  # the documented launch, end to end: run by .ci/run

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"dense": ROOT / "scripts" / "run-qwen2.5-1.5b.sh",
           "rkv": ROOT / "scripts" / "run-qwen2.5-1.5b-rkv.sh"}
# tiny overrides of the reference recipe (extra flags go last, so they win)
TINY = ["--rollout-batch-size", "5", "--n-samples-per-prompt", "2", "--global-batch-size", "10",
        "--rollout-max-response-len", "10", "--eval-max-response-len", "8",
        "--max-tokens-per-gpu", "512", "--sglang-max-total-tokens", "4096", "--reward-workers", "1",
        "--lr", "1e-3", "--rendezvous-timeout", "60"]
RKV_TINY = ["--sglang-compress-max-prompt", "4", "--sglang-compress-divide-length", "2",
            "--sglang-compress-max-window", "2"]


@pytest.fixture(scope="module")
def inputs(tiny_model_factory, tmp_path_factory):
    """A tiny HF checkpoint, a training set and a 5-problem eval set in the scripts' layout."""
    tmp = tmp_path_factory.mktemp("launch")
    train = tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps({
        "prompt": f"<|im_start|>user\nadd {i % 9 + 1} {i % 7 + 3}<|im_end|>\n<|im_start|>assistant\n",
        "label": str(i % 9 + 1 + i % 7 + 3)}) + "\n" for i in range(40)))
    bench = tmp / "eval" / "math500" / "test.jsonl"
    bench.parent.mkdir(parents=True)
    bench.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i),
                                         "solution": f"\\boxed{{{2 * i}}}"}) + "\n" for i in range(5)))
    return tiny_model_factory("qwen2.5"), tmp


def _launch(inputs, recipe: str, nproc: int, out: Path, tp: int = 1) -> tuple[int, str]:
    model, tmp = inputs
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(NUM_GPUS=str(nproc), MODEL_DIR=str(model), DATA_DIR=str(tmp / "data"),
               EVAL_DIR=str(tmp / "eval"), EVAL_SETS="math500", EVAL_INTERVAL="1", NUM_ROLLOUT="2",
               SAVE_DIR=str(out), TP=str(tp), TORCHRUN=f"{sys.executable} -m torch.distributed.run",
               PYTHONWARNINGS="ignore")
    flags = TINY + (RKV_TINY if recipe == "rkv" else [])
    flags += ["--save-debug-rollout-data", str(out / "rollouts" / "{rollout_id}.jsonl")]
    proc = subprocess.run(["bash", str(SCRIPTS[recipe]), *flags], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


LAUNCHES = [("dense", 1), ("dense", 2), ("rkv", 2), ("dense-tp2", 2)]


@pytest.fixture(scope="module")
def runs(inputs, tmp_path_factory):
    """The dense recipe through torchrun on 1 and 2 ranks (and 2 ranks as one TP=2 replica),
    the R-KV recipe on 2."""
    out = {}
    for recipe, nproc in LAUNCHES:
        save = tmp_path_factory.mktemp(f"{recipe}{nproc}")
        tp = 2 if recipe.endswith("tp2") else 1
        out[recipe, nproc] = (save, *_launch(inputs, recipe.split("-")[0], nproc, save, tp))
    return out


def _engines(recipe: str, nproc: int) -> int:
    """An engine on every GPU, TP = 2 too (both tensor-parallel ranks generate)."""
    return nproc


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("recipe,nproc", LAUNCHES)
def test_run_script_through_torchrun_completes(runs, recipe, nproc):
    save, rc, log = runs[recipe, nproc]
    assert rc == 0, log[-4000:]
    metrics = _rows(save / "logs" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    engines = _engines(recipe, nproc)
    for m in metrics:  # every engine generated its shard (5 prompts x 2 samples split by prompt)
        counts = [m[f"rollout_engine{i}/samples"] for i in range(engines)]
        assert sum(counts) == 10 and min(counts) >= 4, counts
        assert f"rollout_engine{engines}/samples" not in m
        assert all(m[f"rollout_engine{i}/tokens_per_s"] > 0 for i in range(engines))
        assert m["time_update"] > 0
        assert (m.get("kv_compressions_per_sample", 0) > 0) == (recipe == "rkv")
    for phase in ("] process group: rank 0 of", "] HF -> torch_dist import",
                  f"] start {engines} colocated rollout engine(s)", "KV pool of rank 0's engine",
                  "] weights to the engine(s)", "] first rollout"):
        assert phase in log, phase
    assert "[startup +" in log
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"


def test_two_engines_sample_what_one_engine_samples(runs):
    """Before any update both launches sample with the same weights and per-sample seeds: the
    gathered batch of 2 engines is the single engine's, sample for sample, in the same order."""
    one, two = (_rows(runs["dense", n][0] / "rollouts" / "0.jsonl") for n in (1, 2))
    assert [r["engine"] for r in two] == [0] * 6 + [1] * 4  # prompts 0-2 on engine 0, 3-4 on 1
    assert [r["index"] for r in two] == list(range(10))
    for a, b in zip(one, two):
        assert a["prompt_ids"] == b["prompt_ids"] and a["response_ids"] == b["response_ids"]
        assert a["reward"] == b["reward"]
        torch.testing.assert_close(torch.tensor(a["logprobs"]), torch.tensor(b["logprobs"]),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("recipe,nproc", [("dense", 1), ("dense", 2), ("dense-tp2", 2)])
def test_engines_serve_the_trainers_weights_after_the_update(runs, inputs, tmp_path, recipe, nproc):
    """The greedy eval after the last update, from every engine, is what the trainer's final
    weights (saved, exported with megatron2hf) give under Hugging Face: each token is HF's
    argmax teacher-forced on the same prefix (near-ties excused). Dense rollouts: a compressed
    cache would rightly differ from HF's full attention. With TP=2 each rank's engine gets the
    full weights gathered from both tensor-parallel ranks."""
    from transformers import AutoModelForCausalLM

    save, rc, log = runs[recipe, nproc]
    assert rc == 0, log[-4000:]
    hf_dir = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "-m", "checkpoint_tools.megatron2hf", "--load", str(save),
                           "--output-dir", str(hf_dir), "--origin-hf-dir", str(inputs[0])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    rows = _rows(save / "logs" / "eval_samples" / "math500_rollout2.jsonl")
    assert sorted({r["engine"] for r in rows}) == list(range(_engines(recipe, nproc)))
    assert all(r["weight_version"] == "rollout-2" for r in rows)
    for r in rows:
        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r["prompt_ids"]) - 1:-1]
        chosen = logits.gather(1, torch.tensor(r["response_ids"])[:, None])[:, 0]
        assert r["response_ids"] and torch.all(chosen >= logits.max(-1).values - 1e-4), r


def _bare_train(inputs, tmp_path, env_extra: dict, *flags) -> subprocess.CompletedProcess:
    model, tmp = inputs
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(PYTHONWARNINGS="ignore", **env_extra)
    argv = ["--hf-checkpoint", str(model), "--prompt-data",
            str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"), "--log-dir",
            str(tmp_path / "logs"), "--num-rollout", "1", *flags]
    return subprocess.run([sys.executable, "-m", "trainer.train", *argv], env=env, cwd=ROOT,
                          text=True, capture_output=True, timeout=120)


def test_unreachable_rendezvous_fails_with_the_address(inputs, tmp_path):
    """Rank 1 of 2 with nobody serving MASTER_PORT: an error naming the address within the
    configured time, not a 10-minute wait."""
    port = cpu_megatron.free_port()
    begin = time.monotonic()
    proc = _bare_train(inputs, tmp_path, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                       "--rendezvous-timeout", "3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in proc.stderr
    assert "rank 1/2" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - begin < 60


def test_missing_rank_is_named(inputs, tmp_path):
    """Rank 0 of 2 serves the store; rank 1 never comes: the missing rank is named."""
    port = cpu_megatron.free_port()
    proc = _bare_train(inputs, tmp_path, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                       "--rendezvous-timeout", "3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank(s) [1] never joined" in proc.stderr and f"MASTER_PORT={port}" in proc.stderr


def test_world_not_divisible_by_model_parallel(inputs, tmp_path):
    port = cpu_megatron.free_port()
    proc = _bare_train(inputs, tmp_path, {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                                          "MASTER_PORT": str(port)},
                       "--tensor-model-parallel-size", "2")
    assert proc.returncode == 1 and "WORLD_SIZE=3 is not divisible" in proc.stderr, proc.stderr[-2000:]


def test_async_dynamic_sampling_on_two_engines_through_torchrun(inputs, tmp_path):
    """Two gloo ranks, an engine each: asynchronous partial rollouts one version behind at most,
    dynamic sampling deciding the same groups on both ranks (the gathers run in the generation
    thread on their own process group)."""
    model, tmp = inputs
    (tmp_path / "parity.py").write_text("def reward(item):\n    return float(len(item.response) % 2)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    argv = ["--nproc-per-node", "2", "--master-port", str(cpu_megatron.free_port()),
            "-m", "trainer.train", "--hf-checkpoint", str(model), "--prompt-data",
            str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"),
            "--log-dir", str(tmp_path / "logs"), "--num-rollout", "3", *TINY,
            "--rollout-batch-size", "4", "--global-batch-size", "8",
            "--kl-loss-coef", "0", "--max-staleness", "1", "--partial-rollout",
            "--custom-rm-path", f"{tmp_path / 'parity.py'}:reward",
            "--dynamic-sampling-filter-path", "reward_nonzero_std", "--over-sampling-batch-size", "2"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT,
                          env={**env, "PYTHONWARNINGS": "ignore"}, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/groups_kept"] == 4 and r["rollout/staleness_max"] <= 1
        assert r["rollout_engine0/samples"] + r["rollout_engine1/samples"] == 8
    # generated (at least its first round) while the previous rollout trained
    assert any(r["rollout/staleness_max"] == 1 for r in rows[1:])


def test_engine_processes_on_two_ranks_through_torchrun(inputs, tmp_path):
    """--rollout-engine-process on two gloo ranks: each rank starts its own engine process,
    rank 0 generates through both, every push reaches both, and each keeps its own log."""
    model, tmp = inputs
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    argv = ["--nproc-per-node", "2", "--master-port", str(cpu_megatron.free_port()),
            "-m", "trainer.train", "--hf-checkpoint", str(model), "--prompt-data",
            str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"),
            "--log-dir", str(tmp_path / "logs"), "--num-rollout", "2", *TINY,
            "--kl-loss-coef", "0", "--rollout-engine-process", "--max-staleness", "1"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT,
                          env={**env, "PYTHONWARNINGS": "ignore"}, text=True, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    logs = [(tmp_path / "logs" / "engines" / f"rank{r}" / "engine0.log").read_text() for r in (0, 1)]
    # each rollout's 10 samples as one batched request per engine (5 samples each)
    assert [log.count("POST /generate") for log in logs] == [2, 2]
    pushes = [log.count("POST /update_weights_from_tensor") for log in logs]
    assert pushes[0] == pushes[1] >= 2


def test_disaggregated_engine_started_by_rank0_through_torchrun(inputs, tmp_path):
    """--rollout-num-gpus 1 under torchrun with two trainer ranks: rank 0 starts one engine
    process of its own (CPU here; a GPU after the trainer's on a GPU node), every rank learns
    its URL, it generates every sample of every rollout one version behind at most, and each
    push reaches it."""
    model, tmp = inputs
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    argv = ["--nproc-per-node", "2", "--master-port", str(cpu_megatron.free_port()),
            "-m", "trainer.train", "--hf-checkpoint", str(model), "--prompt-data",
            str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"),
            "--log-dir", str(tmp_path / "logs"), "--num-rollout", "3", *TINY,
            "--kl-loss-coef", "0", "--rollout-num-gpus", "1", "--max-staleness", "1"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT,
                          env={**env, "PYTHONWARNINGS": "ignore"}, text=True, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout_engine0/samples"] == 10 and "rollout_engine1/samples" not in r
        assert r["aborted"] == 0 and r["rollout/staleness_max"] <= 1
    log = (tmp_path / "logs" / "engines" / "engine0.log").read_text()
    assert log.count("POST /generate") == 3  # one batched request per rollout
    assert log.count("POST /update_weights_from_tensor") >= 3
    assert not (tmp_path / "logs" / "engines" / "engine1.log").exists()
