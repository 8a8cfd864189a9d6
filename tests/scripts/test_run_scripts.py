"""scripts/run-*.sh: syntax, clear errors for missing inputs, and (DRY_RUN=1) the exact trainer
command with the reference hyper-parameters (sparse_rl.md section 2.2)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
NAMES = ["run-qwen2.5-1.5b", "run-qwen2.5-3b", "run-qwen2.5-7b", "run-llama3.2-1b"]
ALL = [f"{n}{suffix}.sh" for n in NAMES for suffix in ("", "-rkv")]

# flag -> value in every script (the reference run's settings)
REFERENCE = {
    "--rollout-batch-size": "128", "--n-samples-per-prompt": "8", "--rollout-max-response-len": "4096",
    "--rollout-temperature": "1.0", "--global-batch-size": "256", "--num-rollout": "100", "--lr": "1e-6",
    "--advantage-estimator": "grpo", "--eps-clip": "0.2", "--eps-clip-high": "0.2",
    "--kl-loss-coef": "1e-4", "--kl-loss-type": "low_var_kl", "--entropy-coef": "0",
    "--loss-agg-mode": "seq_mean_token_mean", "--mis-preset": "sparse_rl", "--rm-type": "math",
    "--input-key": "prompt", "--label-key": "label", "--seed": "1234",
    "--pipeline-model-parallel-size": "1",
}
RKV = {"--sglang-compress-algorithm": "rkv", "--sglang-compress-max-prompt": "512",
       "--sglang-compress-max-window": "8", "--sglang-compress-divide-length": "128",
       "--sglang-compress-divide-method": "step_length"}


@pytest.fixture
def inputs(tmp_path):
    """A fake HF checkpoint, both training sets and the eval sets, and the environment using them."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "data"
    for name in ("simplelr_qwen_level3to5", "simplelr_level3to5"):
        (data / name).mkdir(parents=True)
        (data / name / "train.jsonl").write_text('{"prompt": "p", "label": "1"}\n')
    evals = tmp_path / "eval"
    for name in ("aime24", "amc23", "math500"):
        (evals / name).mkdir(parents=True)
        (evals / name / "test.jsonl").write_text('{"problem": "p", "answer": "1"}\n')
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUM_GPUS", "TP", "PP", "SAVE_DIR", "LOG_DIR", "EVAL_SETS", "REF_LOAD", "DRY_RUN")}
    env.update(MODEL_DIR=str(model), DATA_DIR=str(data), EVAL_DIR=str(evals), SAVE_DIR=str(tmp_path / "save"),
               PREFLIGHT="0", PATH=f"{fake_gpus(tmp_path, 8)}:{os.environ['PATH']}")
    return tmp_path, env


def fake_gpus(tmp_path: Path, count: int | None) -> Path:
    """A folder with an `nvidia-smi` listing `count` GPUs (None: no driver, it fails)."""
    bin_dir = tmp_path / f"bin-{count}"
    bin_dir.mkdir(exist_ok=True)
    body = ("echo 'NVIDIA-SMI has failed' >&2; exit 9" if count is None else
            "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(count)))
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n{body}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


def run(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / script), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def dry_run(script: str, env: dict, *args: str) -> list[str]:
    proc = run(script, {**env, "DRY_RUN": "1"}, *args)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


def flags(argv: list[str]) -> dict[str, list[str]]:
    """Each --flag of the trainer part of the command with the values that follow it."""
    argv = argv[argv.index("trainer.train") + 1:]
    out: dict[str, list[str]] = {}
    current = None
    for token in argv:
        if token.startswith("--"):
            current = token
            out.setdefault(current, [])
        else:
            out[current].append(token)
    return out


def test_syntax_and_executable():
    for script in [*ALL, "lib/common.sh"]:
        path = SCRIPTS / script
        assert path.is_file(), script
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"
    for script in ALL:
        assert os.access(SCRIPTS / script, os.X_OK), script


@pytest.mark.parametrize("script", ALL)
def test_reference_values(script, inputs):
    tmp, env = inputs
    argv = dry_run(script, env, "--num-rollout", "3")
    launcher = argv[:argv.index("trainer.train")]
    assert launcher[-1] == "-m" and launcher[launcher.index("--nproc-per-node") + 1] == "8"
    venv_python = ROOT / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else "python3"
    assert launcher[:3] == [python, "-m", "trainer.startup.torchrun"]  # torchrun, quiet on Ctrl-C
    got = flags(argv)
    for flag, value in REFERENCE.items():
        assert got[flag][0] == value, (script, flag, got[flag])
    assert "--use-mis" in got
    assert argv[-2:] == ["--num-rollout", "3"]  # extra arguments come last, so they override
    sparse = script.endswith("-rkv.sh")
    for flag, value in RKV.items():
        assert got.get(flag) == ([value] if sparse else None), (script, flag)
    # the README's recommendation: the R-KV scripts keep the prompt's KV
    assert ("--sglang-compress-keep-prompt" in got) == sparse, script
    # reference: 0.7 SGLang memory with R-KV, 0.75 dense; the micro-batch is the trainer's size
    # from free memory (issue 60: the reference's 8192 / 9216 halve the speed)
    assert "--max-tokens-per-gpu" not in got
    assert got["--sglang-mem-fraction-static"] == (["0.7"] if sparse else ["0.75"])
    assert got["--tensor-model-parallel-size"] == (["2"] if "7b" in script else ["1"])
    llama = "llama" in script
    data = "simplelr_level3to5" if llama else "simplelr_qwen_level3to5"
    assert got["--prompt-data"] == [str(tmp / "data" / data / "train.jsonl")]
    assert ("--apply-chat-template" in got) == llama
    model = str(tmp / "model")
    assert got["--hf-checkpoint"] == [model] and got["--load"] == [model] and got["--ref-load"] == [model]
    assert got["--save"] == [str(tmp / "save")]
    assert got["--log-dir"] == [str(tmp / "save" / "logs")]
    eval_dir = tmp / "save" / "eval_data"
    assert got["--eval-prompt-data"] == [x for n in ("aime24", "amc23", "math500")
                                         for x in (n, str(eval_dir / f"{n}.jsonl"))]
    # the benchmark rows (problem "p", answer "1") become prompt/label rows in the training format
    rows = [json.loads(line) for line in (eval_dir / "amc23.jsonl").read_text().splitlines()]
    user = "p\nPlease reason step by step, and put your final answer within \\boxed{}."
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]
    if llama:
        assert rows == [{"prompt": messages, "label": "1"}]
    else:
        assert rows == [{"prompt": f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                   f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n", "label": "1"}]
    for flag in ("--save-interval", "--eval-interval", "--n-samples-per-eval-prompt", "--eval-max-response-len",
                 "--rollout-top-p"):
        assert len(got[flag]) == 1
    assert "--use-wandb" not in got and "--custom-rm-path" not in got


def test_overrides_from_environment(inputs):
    tmp, env = inputs
    save = tmp / "save"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("20")
    got = flags(argv := dry_run("run-qwen2.5-3b-rkv.sh", {**env, "NUM_GPUS": "4", "TP": "2", "EVAL_SETS": "",
                                                          "USE_WANDB": "1", "CUSTOM_RM_PATH": "my.rm:f"}))
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert got["--tensor-model-parallel-size"] == ["2"]
    assert got["--load"] == [str(save)]  # resume from our own checkpoint
    assert "--eval-prompt-data" not in got
    assert got["--use-wandb"] == [] and got["--wandb-project"] == ["sparse-rl"]
    assert got["--custom-rm-path"] == ["my.rm:f"] and "--rm-type" not in got


def test_launch_keeps_cwd_and_sets_environment(inputs):
    tmp, env = inputs
    fake = tmp / "fake_torchrun.sh"
    fake.write_text('#!/usr/bin/env bash\necho "cwd=$PWD"\necho "pythonpath=$PYTHONPATH"\n'
                    'echo "cdmc=$CUDA_DEVICE_MAX_CONNECTIONS"\necho "args=$*"\n')
    fake.chmod(0o755)
    work = tmp / "work"
    work.mkdir()
    (work / "rel_model").symlink_to(tmp / "model")
    proc = subprocess.run(["bash", str(SCRIPTS / "run-qwen2.5-1.5b.sh"), "--lr", "2e-6"], cwd=work,
                          env={**env, "TORCHRUN": f"{fake} --fake-flag", "MODEL_DIR": "rel_model",
                               "EVAL_SETS": "", "TORCHRUN_ARGS": "--nnodes 2"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert out["cwd"] == str(work)  # relative paths given by the user still resolve
    assert out["pythonpath"].split(":")[0] == str(ROOT)
    assert out["cdmc"] == "1"
    args = out["args"].split()
    assert args[:5] == ["--fake-flag", "--nnodes", "2", "--nproc-per-node", "8"]
    assert args[args.index("--hf-checkpoint") + 1] == "rel_model" and args[-2:] == ["--lr", "2e-6"]
    assert (tmp / "save" / "logs").is_dir()


@pytest.mark.parametrize("variable, value, message", [
    ("MODEL_DIR", "/nonexistent/Qwen2.5-3B", "MODEL_DIR=/nonexistent/Qwen2.5-3B does not exist"),
    ("DATA_DIR", "/nonexistent/data", "training data /nonexistent/data/simplelr_qwen_level3to5/train.jsonl "
                                      "not found; set DATA_DIR"),
    ("EVAL_DIR", "/nonexistent/eval", "eval data /nonexistent/eval/aime24/test.jsonl not found; set EVAL_DIR"),
    ("REF_LOAD", "/nonexistent/ref", "REF_LOAD=/nonexistent/ref does not exist"),
    ("TP", "3", "NUM_GPUS=8 is not divisible by TP*PP=3"),
    ("NUM_GPUS", "zero", "NUM_GPUS=zero is not a positive integer"),
])
def test_missing_inputs_fail_clearly(inputs, variable, value, message):
    _, env = inputs
    proc = run("run-qwen2.5-3b.sh", {**env, variable: value})  # checked before anything launches
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr
    assert proc.stdout == ""
    dry = run("run-qwen2.5-3b.sh", {**env, variable: value, "DRY_RUN": "1"})
    if variable in ("TP", "NUM_GPUS"):  # a wrong value, not a missing file: a dry run fails too
        assert dry.returncode == 1 and message in dry.stderr and dry.stdout == ""
    else:  # a dry run prints the command and notes what is missing
        assert dry.returncode == 0 and f"note (dry run): {message}" in dry.stderr, dry.stderr
        assert "-m trainer.train" in dry.stdout


def test_keep_prompt_0_gives_the_papers_setting(inputs):
    _, env = inputs
    got = flags(dry_run("run-qwen2.5-3b-rkv.sh", {**env, "KEEP_PROMPT": "0", "EVAL_SETS": ""}))
    assert "--sglang-compress-keep-prompt" not in got
    assert got["--sglang-compress-max-prompt"] == ["512"]


def test_dry_run_with_nothing_on_disk(inputs):
    tmp, env = inputs
    nothing = {"MODEL_DIR": str(tmp / "none" / "model"), "DATA_DIR": str(tmp / "none" / "data"),
               "EVAL_DIR": str(tmp / "none" / "eval"), "SAVE_DIR": str(tmp / "none" / "save")}
    for script in ALL:
        proc = run(script, {**env, **nothing, "DRY_RUN": "1"})
        assert proc.returncode == 0, proc.stderr
        argv = shlex.split(proc.stdout)
        assert argv[argv.index("--hf-checkpoint") + 1] == nothing["MODEL_DIR"]
        assert proc.stderr.count("note (dry run):") == 6  # model, ref, data, 3 eval sets
    assert not (tmp / "none").exists()  # a dry run writes nothing where nothing is


@pytest.mark.parametrize("gpus", [2, 8])
def test_num_gpus_defaults_to_the_gpus_present(inputs, gpus):
    tmp, env = inputs
    env = {**env, "PATH": f"{fake_gpus(tmp, gpus)}:{os.environ['PATH']}"}
    proc = run("run-qwen2.5-3b.sh", {**env, "DRY_RUN": "1", "EVAL_SETS": ""})
    argv = shlex.split(proc.stdout)
    assert argv[argv.index("--nproc-per-node") + 1] == str(gpus)
    assert f"NUM_GPUS={gpus}: the GPUs nvidia-smi lists" in proc.stderr


def test_without_gpus_it_says_it_starts_cpu_ranks(inputs):
    tmp, env = inputs
    env = {**env, "PATH": f"{fake_gpus(tmp, None)}:{os.environ['PATH']}", "DRY_RUN": "1", "EVAL_SETS": ""}
    proc = run("run-qwen2.5-3b.sh", env)
    argv = shlex.split(proc.stdout)
    assert argv[argv.index("--nproc-per-node") + 1] == "1"
    assert "no GPU found (nvidia-smi): starting 1 CPU rank(s)" in proc.stderr
    proc = run("run-qwen2.5-3b.sh", {**env, "NUM_GPUS": "2"})
    assert "starting 2 CPU rank(s)" in proc.stderr


def test_prompts_longer_than_the_context_stop_before_any_rank(inputs, tmp_path_factory):
    import sys

    from checkpoint_tools.tiny_models import make_tiny_model

    tmp, env = inputs
    model = make_tiny_model("qwen2.5", tmp_path_factory.mktemp("tiny") / "m")  # 1024-token context
    data = tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"
    rows = [{"prompt": "1 + 1 =", "label": "2"}] * 3 + [{"prompt": "1 " * 2000, "label": "2"}] * 2
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake = tmp / "torchrun.sh"
    fake.write_text("#!/usr/bin/env bash\necho launched\n")
    fake.chmod(0o755)
    env = {**env, "MODEL_DIR": str(model), "EVAL_SETS": "", "PREFLIGHT": "1", "TORCHRUN": str(fake),
           "PYTHON": sys.executable, "NUM_GPUS": "1"}
    proc = subprocess.run(["bash", str(SCRIPTS / "run-qwen2.5-3b.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "launched" not in proc.stdout
    assert "error: 2 of 5 prompts in " in proc.stderr and "(1024 tokens;" in proc.stderr, proc.stderr
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    proc = subprocess.run(["bash", str(SCRIPTS / "run-qwen2.5-3b.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "launched" in proc.stdout, proc.stderr
    assert "preflight: 3 prompts" in proc.stdout


def test_bad_eval_rows_fail_clearly(inputs):
    tmp, env = inputs
    (tmp / "eval" / "amc23" / "test.jsonl").write_text('{"problem": "p"}\n')  # no answer
    proc = run("run-qwen2.5-3b.sh", {**env, "DRY_RUN": "1"})
    assert proc.returncode == 1
    assert "amc23/test.jsonl:1" in proc.stderr
    assert "could not prepare the eval data from EVAL_DIR=" in proc.stderr


def test_model_dir_without_config(inputs):
    tmp, env = inputs
    (tmp / "model" / "config.json").unlink()
    proc = run("run-llama3.2-1b-rkv.sh", env)
    assert proc.returncode == 1
    assert f"MODEL_DIR={tmp / 'model'} has no config.json" in proc.stderr
    assert "Llama-3.2-1B-Instruct" in proc.stderr


def test_default_model_dir_is_named(inputs):
    _, env = inputs
    env = {k: v for k, v in env.items() if k != "MODEL_DIR"}
    expected = ROOT / "models" / "Qwen2.5-7B"  # where get-smollm2.sh and the README put models
    if expected.exists() or (ROOT.parent / "models" / "Qwen2.5-7B").exists():
        pytest.skip(f"{expected} or its ../models twin exists on this machine")
    proc = run("run-qwen2.5-7b.sh", env)
    assert proc.returncode == 1
    assert f"MODEL_DIR={expected} does not exist" in proc.stderr


def test_the_former_model_location_still_works(tmp_path):
    """A checkout whose models sit beside it (../models, the former default) keeps working."""
    repo = tmp_path / "repo"
    (repo / "scripts" / "lib").mkdir(parents=True)
    for script in ("run-qwen2.5-3b.sh", "lib/common.sh"):
        (repo / "scripts" / script).write_text((SCRIPTS / script).read_text())
    (tmp_path / "models" / "Qwen2.5-3B").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "NUM_GPUS", "TP", "PP")}
    env.update(DRY_RUN="1", EVAL_SETS="", PATH=f"{fake_gpus(tmp_path, 8)}:{os.environ['PATH']}")
    argv = shlex.split(run_in(repo, "run-qwen2.5-3b.sh", env).stdout)
    assert argv[argv.index("--hf-checkpoint") + 1] == str(tmp_path / "models" / "Qwen2.5-3B")
    (repo / "models" / "Qwen2.5-3B").mkdir(parents=True)  # both: the checkout's wins
    argv = shlex.split(run_in(repo, "run-qwen2.5-3b.sh", env).stdout)
    assert argv[argv.index("--hf-checkpoint") + 1] == str(repo / "models" / "Qwen2.5-3B")


def run_in(repo: Path, script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / script)], env=env, capture_output=True,
                          text=True, timeout=60)


EVERY_RUN_SCRIPT = sorted(p.name for p in SCRIPTS.glob("run-*.sh"))


@pytest.mark.parametrize("script", EVERY_RUN_SCRIPT)
def test_dry_run_works_on_a_machine_without_gpus_or_inputs(tmp_path, script):
    """DRY_RUN=1 on a bare CPU box (nvidia-smi fails, no model, no data, no python environment
    needed): the command is printed, for the recipe's 8 GPUs where one CPU rank cannot hold
    TP*PP (the 7B scripts' TP=2), and nothing is written."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUM_GPUS", "TP", "PP", "MODEL_DIR", "DATA_DIR", "EVAL_DIR", "EVAL_SETS")}
    env.update(DRY_RUN="1", SAVE_DIR=str(tmp_path / "save"), DATA_DIR=str(tmp_path / "data"),
               MODEL_DIR=str(tmp_path / "model"), EVAL_DIR=str(tmp_path / "eval"),
               PYTHON="/nonexistent/python", PATH=f"{fake_gpus(tmp_path, None)}:{os.environ['PATH']}")
    proc = run(script, env)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert "trainer.train" in argv or "trainer.ray_job" in argv, proc.stdout
    tp = int(flags(argv).get("--tensor-model-parallel-size", ["1"])[0])
    assert argv[argv.index("--nproc-per-node") + 1] == ("8" if tp > 1 else "1"), proc.stderr
    assert "error" not in proc.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "save").exists()


def test_rollout_gpus_under_torchrun_disaggregates(inputs):
    """ROLLOUT_GPUS without RAY: the trainer on NUM_GPUS ranks, and its rank 0 starts the engines
    on the GPUs after them (--rollout-num-gpus), instead of the colocated command."""
    _, env = inputs
    argv = dry_run("run-qwen2.5-3b-rkv.sh", {**env, "NUM_GPUS": "1", "ROLLOUT_GPUS": "1",
                                             "EVAL_SETS": ""})
    assert argv[argv.index("--nproc-per-node") + 1] == "1"
    assert flags(argv)["--rollout-num-gpus"] == ["1"]
    assert "--rollout-num-gpus" not in dry_run("run-qwen2.5-3b-rkv.sh", {**env, "EVAL_SETS": ""})
    proc = run("run-qwen2.5-3b-rkv.sh", {**env, "ROLLOUT_GPUS": "x", "DRY_RUN": "1"})
    assert proc.returncode != 0 and "ROLLOUT_GPUS=x is not a non-negative integer" in proc.stderr
