"""``python -m trainer.ray_job`` on a local Ray cluster with declared (fake) GPU slots, the trainer
ranks on the CPU with gloo: the RAY=1 run-script launch with two colocated ranks, one rank with two
disaggregated engines (sglang-router in front), one of them killed mid-rollout and replaced, a rank
that fails, Ctrl-C, and the errors that must come before anything is reserved. Every job runs in a session of its own, under a timeout, and
must leave no process of that session behind (trainer ranks, engine servers, the router, Ray)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytest.importorskip("ray")

from trainer.ray import options, supervisor  # noqa: E402
from trainer.ray.engines import exit_after  # noqa: E402
from trainer.ray.node import local_gpu_index  # noqa: E402
from trainer.ray.placement import order_bundles  # noqa: E402
from trainer.ray.trainer_actor import _ErrorTail  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run-qwen2.5-1.5b.sh"
TINY = ["--rollout-batch-size", "5", "--n-samples-per-prompt", "2", "--global-batch-size", "10",
        "--rollout-max-response-len", "10", "--max-tokens-per-gpu", "512",
        "--sglang-max-total-tokens", "4096", "--reward-workers", "1", "--lr", "1e-3",
        "--rendezvous-timeout", "60", "--distributed-timeout-minutes", "10"]
JOB_TIMEOUT = 240


@pytest.fixture(scope="module")
def inputs(tiny_model_factory, tmp_path_factory):
    """A tiny HF checkpoint and a training set in the run scripts' layout."""
    tmp = tmp_path_factory.mktemp("ray")
    train = tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps({
        "prompt": f"<|im_start|>user\nadd {i % 9 + 1} {i % 7 + 3}<|im_end|>\n<|im_start|>assistant\n",
        "label": str(i % 9 + 1 + i % 7 + 3)}) + "\n" for i in range(40)))
    return tiny_model_factory("qwen2.5"), tmp


def _env(**extra) -> dict:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONWARNINGS="ignore", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def _session_left(sid: int) -> list[str]:
    """Live processes of session ``sid`` (zombies are dead, whoever must reap them)."""
    left = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                left.append((proc / "cmdline").read_text().replace("\0", " ")[:120])
        except (OSError, ValueError):
            continue
    return left


def _wait_session_empty(sid: int, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _session_left(sid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


class Job:
    """A job in its own session: output in a file, killed whole (SIGKILL to the session's group)
    if it outlives its timeout or the test fails."""

    def __init__(self, argv: list[str], env: dict, log: Path):
        self.log = log
        # SIGINT at its default, as under a terminal: an ignored SIGINT is inherited through exec,
        # and something earlier in the full suite leaves the pytest process ignoring it (the
        # Ctrl-C test then failed only in whole-suite runs)
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.begin = time.monotonic()

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc.poll() is None, f"job ended before {text!r}:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout}s:\n{self.output[-3000:]}"
            time.sleep(0.5)

    def finish(self, timeout: float = JOB_TIMEOUT) -> tuple[int, str, list[str]]:
        """(exit code, output, processes of the session still alive afterwards)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        left = _wait_session_empty(self.proc.pid)
        self.kill()
        assert rc is not None, f"job still running after {timeout}s:\n{self.output[-3000:]}"
        return rc, self.output, left

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid_dir in Path("/proc").iterdir():  # members that left the group, not the session
            try:
                stat = (pid_dir / "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[3]) == self.proc.pid:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


@pytest.fixture
def jobs():
    started: list[Job] = []
    yield lambda argv, env, log: started.append(Job(argv, env, log)) or started[-1]
    for job in started:
        job.kill()


def _ray_job(inputs, save: Path, *flags: str) -> list[str]:
    model, tmp = inputs
    return [sys.executable, "-m", "trainer.ray_job", *flags, "--hf-checkpoint", str(model),
            "--prompt-data", str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl"),
            "--rm-type", "math", "--num-rollout", "2", "--save", str(save), *TINY]


@pytest.fixture(scope="module")
def disaggregated(inputs, tmp_path_factory):
    """One fault-free job: a trainer actor and two engine actors (sglang-router in front), three
    rollouts with their samples saved: (exit code, output, processes left, save dir, samples)."""
    pytest.importorskip("sglang_router")
    tmp = tmp_path_factory.mktemp("disaggregated")
    job = Job(_disaggregated_argv(inputs, tmp), _env(), tmp / "job.log")
    try:
        yield (*job.finish(), tmp / "save", _samples(tmp / "debug"))
    finally:
        job.kill()


def _disaggregated_argv(inputs, tmp: Path) -> list[str]:
    return [*_ray_job(inputs, tmp / "save", "--rollout-num-gpus", "2"), "--num-rollout", "3",
            "--save-debug-rollout-data", str(tmp / "debug" / "rollout_{rollout_id}.jsonl"),
            "--engine-start-timeout", "120", "--rollout-samples-per-request", "2"]


def _samples(debug: Path) -> list[list[dict]]:
    """Each rollout's saved samples (--save-debug-rollout-data), in order."""
    files = sorted(debug.glob("rollout_*.jsonl"), key=lambda f: int(f.stem.split("_")[1]))
    return [[json.loads(x) for x in f.read_text().splitlines()] for f in files]


def _metrics(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "logs" / "metrics.jsonl").read_text().splitlines()]


def _engine_report(log: str) -> dict[str, tuple[int, int]]:
    """url -> (/generate requests, weight update requests), from the job's closing lines."""
    found = re.findall(r"rollout engine \d+ \((http://[^)]+)\) served (\d+) /generate and (\d+) "
                       r"weight update", log)
    return {url: (int(g), int(u)) for url, g, u in found}


def _refuses(url: str) -> bool:
    try:
        requests.get(url + "/health", timeout=2)
    except requests.ConnectionError:
        return True
    return False


# --------------------------------------------------------------------------- jobs on Ray

@pytest.mark.launch
def test_run_script_with_ray_two_colocated_ranks(inputs, tmp_path, jobs):
    """RAY=1 NUM_GPUS=2: two trainer actors, each hosting its engine, finish 2 rollouts."""
    model, tmp = inputs
    save = tmp_path / "save"
    env = _env(RAY="1", NUM_GPUS="2", MODEL_DIR=str(model), DATA_DIR=str(tmp / "data"),
               EVAL_SETS="", NUM_ROLLOUT="2", SAVE_DIR=str(save))
    job = jobs(["bash", str(SCRIPT), *TINY], env, tmp_path / "job.log")
    rc, log, left = job.finish()
    assert rc == 0, log[-4000:]
    metrics = _metrics(save)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # both ranks' engines generated their shard: 5 prompts x 2 samples
        counts = [m[f"rollout_engine{i}/samples"] for i in range(2)]
        assert sum(counts) == 10 and min(counts) >= 4, counts
        assert "rollout_engine2/samples" not in m and m["time_update"] > 0
    for phase in ("] connect to Ray: ", "local cluster: 2 GPU (declared", "] reserve 2 GPU(s) for "
                  "trainer ranks (STRICT_PACK): ", "] start 2 trainer rank actor(s): ",
                  "TrainerRank0 pid=", "process group: rank 0 of 2 (env launch)",
                  "gloo on cpu, TP 1 x PP 1 x DP 2", "] start 2 colocated rollout engine(s)"):
        assert phase in log, phase
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert left == [], left


@pytest.mark.launch
def test_disaggregated_engines_behind_the_router(disaggregated):
    """One trainer actor, two engine actors (sglang-router in front, for other clients): the
    trainer spread the samples over both engines and each took every weight update (the trainer
    checks each sample's weight version), and no engine server is left listening afterwards."""
    rc, log, left, save, samples = disaggregated
    assert rc == 0, log[-4000:]
    assert [m["step"] for m in _metrics(save)] == [1, 2, 3]
    assert all(m["rollout_engine0/samples"] == 10 for m in _metrics(save))  # rank 0 generates
    assert all(m["rollout/engine_failures"] == 0 for m in _metrics(save))
    assert [len(rows) for rows in samples] == [10, 10, 10]
    report = _engine_report(log)
    assert len(report) == 2, log[-3000:]
    # round robin, 5 samples per engine per rollout in batched requests of 2, 2 and 1; a push
    # per rollout
    assert all(g == 3 * 3 and u == 3 for g, u in report.values()), report
    for phase in ("] reserve 2 GPU(s) for rollout engines (PACK): ",
                  "] start 2 rollout engine(s) (sglang-kvc HTTP servers): ",
                  "] start sglang-router: ", "-> 2 engine(s), round robin",
                  "] start 2 rollout server(s)"):
        assert phase in log, phase
    assert all(_refuses(url) for url in report), "an engine server outlived the job"
    assert left == [], left


def _drill_job(jobs, argv: list[str], drill: str, tmp_path: Path):
    """A 3-rollout job with the fault drill ``drill``: (log, processes left, metrics, the fault
    counts summed over the rollouts)."""
    job = jobs(argv, _env(TRAINER_RAY_ENGINE_EXIT_AFTER=drill), tmp_path / "job.log")
    rc, log, left = job.finish()
    assert rc == 0, log[-4000:]
    metrics = _metrics(tmp_path / "save")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    faults = {k: sum(m[f"rollout/{k}"] for m in metrics)
              for k in ("engine_failures", "engine_restarts", "requests_reissued")}
    return log, left, metrics, faults


@pytest.mark.launch
def test_engine_killed_mid_rollout_is_replaced_and_no_sample_is_lost(inputs, tmp_path, jobs,
                                                                   disaggregated):
    """The drill: engine 0 SIGKILLs itself at its 5th /generate request (batches of 2 samples:
    3 requests a rollout), in rollout 2 of 3 with requests in flight. The job goes on: the trainer re-issues them to engine 1, the supervisor
    starts another engine 0 on the same GPU bundle and the trainer re-syncs it (the last weights)
    before it serves rollout 3. Every rollout has each of its 10 samples once, at the current
    weight version, equal to the fault-free job's (same index, same seed), and the step log counts
    the failure, the restart and the re-issued requests."""
    log, left, metrics, faults = _drill_job(jobs, _disaggregated_argv(inputs, tmp_path), "0:5",
                                            tmp_path)
    assert faults["engine_failures"] == 1 and faults["engine_restarts"] == 1, faults
    assert faults["requests_reissued"] >= 1 and metrics[1]["rollout/engine_failures"] == 1

    samples, expected = _samples(tmp_path / "debug"), disaggregated[4]
    for rows, reference, version in zip(samples, expected, ["default", "rollout-1", "rollout-2"],
                                        strict=True):
        assert [row["index"] for row in rows] == list(range(10))  # each sample once, in place
        assert all(row["weight_version"] == version for row in rows), rows
        assert [row["response_ids"] for row in rows] == [row["response_ids"] for row in reference]

    first = re.search(r"sglang-kvc HTTP servers\): [\d.]+s \((http://[^,)]+), (http://[^)]+)\)",
                      log)
    assert first, log[-3000:]
    assert f"rollout engine 0 ({first[1]}) is down: starting another on its GPU bundle" in log
    new = re.search(r"rollout engine 0 is back at (http://\S+) after", log)[1]
    report = _engine_report(log)
    assert set(report) == {new, first[2]} and new != first[1], report
    # the replacement served rollout 3 (3 batched requests) and took the re-sync + the pushes
    # after rollouts 2 and 3
    assert report[new] == (3, 3) and "since it was restarted (1x)" in log, report  # 3 batches
    assert "sglang-router did not" not in log
    assert all(_refuses(url) for url in [*first.groups(), new]), "an engine outlived the job"
    assert left == [], left


@pytest.mark.launch
@pytest.mark.slow  # long; CI runs launch and not slow (tests/README.md)
def test_engine_killed_during_a_weight_push_is_restarted_resynced_and_used(inputs, tmp_path, jobs,
                                                                          disaggregated):
    """The drill: engine 0 SIGKILLs itself when the second weight push (after rollout 2) reaches
    it. The push goes on to engine 1; the supervisor starts another engine 0, the trainer re-syncs
    it to the weights of that push (rollout-2), and it serves rollout 3. No sample is lost: every
    rollout equals the fault-free job's (whose pushes went through NCCL/gloo broadcasts: the same
    weights), at the weight version it should have. (--weight-sync tensor: a death inside a
    distributed broadcast still ends the job; resubmitting resumes it.)"""
    log, left, metrics, faults = _drill_job(
        jobs, [*_disaggregated_argv(inputs, tmp_path), "--weight-sync", "tensor"],
        "0:update_weights_from_tensor:2", tmp_path)
    assert faults == {"engine_failures": 1, "engine_restarts": 1, "requests_reissued": 0}, faults
    for rows, reference, version in zip(_samples(tmp_path / "debug"), disaggregated[4],
                                        ["default", "rollout-1", "rollout-2"], strict=True):
        assert [row["index"] for row in rows] == list(range(10))
        assert all(row["weight_version"] == version for row in rows), rows
        assert [row["response_ids"] for row in rows] == [row["response_ids"] for row in reference]
    first = re.search(r"sglang-kvc HTTP servers\): [\d.]+s \((http://[^,)]+), (http://[^)]+)\)",
                      log)
    assert f"rollout engine 0 ({first[1]}) is down: starting another on its GPU bundle" in log
    new = re.search(r"rollout engine 0 is back at (http://\S+) after", log)[1]
    report = _engine_report(log)
    # the replacement: rollout 3's share of /generate; two weight updates: the restart hook's
    # re-sync to the push it died in, and the push after rollout 3
    assert report[new][1] == 2 and report[new][0] > 0 and report[first[2]][1] == 3, report
    assert "sync_engines_lost" in metrics[1] and sum(m["sync_engines_lost"] for m in metrics) == 1
    assert all(_refuses(url) for url in [*first.groups(), new]), "an engine outlived the job"
    assert left == [], left


FAULTY_REWARD = """
import os
from pathlib import Path

def reward(sample):
    # rank 1 fails once the first checkpoint is on disk, while FAULT exists
    if os.environ["RANK"] == "1" and Path("{fault}").exists() and Path("{ckpt}").exists():
        raise ValueError("bad label on rank 1")
    return 0.0
"""


@pytest.mark.launch
@pytest.mark.slow  # long; CI runs launch and not slow (tests/README.md)
def test_failing_rank_ends_the_job_naming_it_and_resubmitting_resumes(inputs, tmp_path, jobs):
    """Rank 1's reward function raises in rollout 2 while rank 0 waits in a collective: the job
    ends (not after the 10-minute collective timeout) naming the rank and its error, checkpoint 1
    stays, and the same command with --load resumes from it to the end."""
    save, fault = tmp_path / "save", tmp_path / "FAULT"
    fault.touch()
    faulty = tmp_path / "faulty_reward.py"
    faulty.write_text(FAULTY_REWARD.format(fault=fault, ckpt=save / "latest_checkpointed_iteration.txt"))
    argv = _ray_job(inputs, save, "--actor-num-gpus-per-node", "2", "--colocate",
                    "--custom-rm-path", f"{faulty}:reward", "--save-interval", "1")
    job = jobs(argv, _env(), tmp_path / "job.log")
    rc, log, left = job.finish()
    assert rc == 1, log[-4000:]
    # rank 1's shard failed; every rank raises it (rollout/manager.py), so the first rank the job
    # hears from may be either: the error names the engine and its cause
    assert re.search(r"trainer\.ray_job: error: trainer rank [01] failed", log), log[-4000:]
    assert "rollout failed on engine 1" in log and "ValueError: bad label on rank 1" in log
    assert f"run the same command with --load {save} to resume" in log
    assert time.monotonic() - job.begin < 200 and left == [], left
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "1"

    fault.unlink()  # the bug fixed: the same command, resuming
    rc, log, left = jobs([*argv, "--load", str(save)], _env(), tmp_path / "again.log").finish()
    assert rc == 0, log[-4000:]
    assert f"] resume from {save}: " in log and left == [], left
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert _metrics(save)[-1]["step"] == 2


@pytest.mark.launch
def test_ctrl_c_stops_engines_router_and_ranks(inputs, tmp_path, jobs):
    """SIGINT once the engines and the router serve: exit 130, nothing of the job survives."""
    pytest.importorskip("sglang_router")
    argv = _ray_job(inputs, tmp_path / "save", "--rollout-num-gpus", "1")
    job = jobs(argv, _env(), tmp_path / "job.log")
    job.wait_for("] start sglang-router: ", timeout=150)
    engine = re.search(r"sglang-kvc HTTP servers\): [\d.]+s \((http://[^,)]+)\)", job.output)[1]
    os.killpg(job.proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    rc, log, left = job.finish(timeout=60)
    assert rc == 130 and "interrupted (SIGINT) during the Ray job (every trainer rank and engine " \
        "is stopped)" in log, log[-3000:]
    assert _refuses(engine) and left == [], left


@pytest.mark.launch
def test_too_few_gpus_is_an_error_naming_the_flags(inputs, tmp_path, jobs):
    argv = _ray_job(inputs, tmp_path / "save", "--actor-num-gpus-per-node", "2",
                    "--rollout-num-gpus", "1", "--local-num-gpus", "2")
    rc, log, left = jobs(argv, _env(), tmp_path / "job.log").finish(timeout=120)
    assert rc == 1, log[-3000:]
    assert ("has 2 GPU(s) but the job needs 3: --actor-num-nodes 1 x --actor-num-gpus-per-node 2 "
            "trainer GPU(s) + --rollout-num-gpus 1 engine GPU(s)") in log
    assert "Traceback" not in log and left == [], left


@pytest.mark.launch
def test_unreachable_cluster_fails_within_the_connect_timeout(inputs, tmp_path, jobs):
    """Ray retries a head that does not answer for ever; the job gives up after
    --ray-connect-timeout naming the address (a loopback port nobody serves)."""
    from checkpoint_tools.cpu_megatron import free_port

    address = f"127.0.0.1:{free_port()}"
    argv = _ray_job(inputs, tmp_path / "save", "--ray-address", address,
                    "--ray-connect-timeout", "5")
    # Ray's own switch to keep 127.0.0.1 as it is (it would swap in this host's address)
    job = jobs(argv, _env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"), tmp_path / "job.log")
    rc, log, left = job.finish(timeout=90)
    assert rc == 1, log[-3000:]
    assert f"trainer.ray_job: error: --ray-address {address}: " in log, log[-3000:]
    assert time.monotonic() - job.begin < 60 and left == [], left


PLACEMENT_TIMEOUT = """
import os, time
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray
from trainer.ray.options import RayJobError
from trainer.ray.placement import reserve
ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False)
begin = time.monotonic()
try:
    reserve("trainer ranks", 2, "STRICT_PACK", timeout=2)
except RayJobError as e:
    print("ERROR", e, "after", round(time.monotonic() - begin))
ray.shutdown()
"""


@pytest.mark.launch
def test_placement_that_cannot_be_met_fails_with_what_is_free(tmp_path, jobs):
    job = jobs([sys.executable, "-c", PLACEMENT_TIMEOUT], _env(), tmp_path / "job.log")
    rc, log, left = job.finish(timeout=90)
    assert rc == 0, log[-3000:]
    line = next(x for x in log.splitlines() if x.startswith("ERROR"))
    assert "trainer ranks: 2 bundle(s) of {'GPU': 1, 'CPU': 1} (STRICT_PACK) not placed within 2s" in line
    assert "free now: 1 GPU" in line and "nodes: 127.0.0.1 (1 GPU, 4 CPU)" in line
    assert int(line.rsplit(" ", 1)[1]) < 10 and left == [], left


# --------------------------------------------------------------------------- flags, no cluster

def test_flags_split_between_the_job_and_the_trainer():
    opts, rest = options.parse(["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4",
                                "--lr", "1e-3", "--rollout-num-gpus", "4", "--save", "x"])
    assert rest == ["--lr", "1e-3", "--save", "x"]
    assert (opts.trainer_gpus, opts.num_engines, opts.gpus_needed, opts.colocate) == (8, 4, 12, False)
    opts, _ = options.parse(["--actor-num-gpus-per-node", "4"])
    assert opts.colocate and opts.num_engines == 0 and opts.gpus_needed == 4
    opts, _ = options.parse(["--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4", "--colocate"])
    assert opts.colocate and opts.gpus_needed == 4  # slime's colocated form


@pytest.mark.parametrize("flags,message", [
    (["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"],
     "--rollout-num-gpus 3 is not divisible by --rollout-num-gpus-per-engine 2"),
    (["--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"],
     "--rollout-num-gpus-per-engine 2: an sglang-kvc engine serves the model on one GPU"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "3", "--colocate"],
     "--rollout-num-gpus must be left out or equal 2"),
    (["--rollout-num-gpus", "2", "--rollout-server-urls", "http://x"],
     "--rollout-server-urls and --rollout-num-gpus 2: the job starts the engines"),
    (["--actor-num-gpus-per-node", "0"], "--actor-num-gpus-per-node must be >= 1"),
])
def test_bad_flags_exit_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        options.parse(flags)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_trainer_flags_are_checked_before_the_cluster(inputs, tmp_path):
    """The trainer's own rules (and TP x PP against the ranks) fail in seconds, before Ray."""
    model, tmp = inputs
    base = [sys.executable, "-m", "trainer.ray_job", "--hf-checkpoint", str(model),
            "--prompt-data", str(tmp / "data" / "simplelr_qwen_level3to5" / "train.jsonl")]
    run = lambda *f: subprocess.run([*base, *f], cwd=ROOT, env=_env(), text=True,  # noqa: E731
                                    capture_output=True, timeout=120)
    proc = run("--actor-num-gpus-per-node", "3", "--tensor-model-parallel-size", "2")
    assert proc.returncode == 1 and "3 trainer GPU(s)" in proc.stderr
    assert "not divisible by --tensor-model-parallel-size" in proc.stderr
    proc = run("--rollout-top-p", "0.9")
    assert proc.returncode == 2 and "truncated sampling is not supported" in proc.stderr
    assert "connect to Ray" not in proc.stdout + proc.stderr


def test_engine_urls_need_the_router_url(inputs, capsys):
    """The trainer's hook for a router: weight updates go to --rollout-engine-urls, which only
    make sense behind --rollout-server-urls."""
    from trainer.arguments import parse_args
    from trainer.rollout.engines.config import weight_sync_mode

    model, tmp = inputs
    (tmp / "unused.jsonl").write_text('{"prompt": "p", "label": "1"}\n')  # checked at parsing
    base = ["--hf-checkpoint", str(model), "--prompt-data", str(tmp / "unused.jsonl")]
    args = parse_args([*base, "--rollout-server-urls", "http://router", "--rollout-engine-urls",
                       "http://e0", "http://e1"])
    assert args.rollout_engine_urls == ["http://e0", "http://e1"] and weight_sync_mode(args) == "tensor"
    with pytest.raises(SystemExit):
        parse_args([*base, "--rollout-engine-urls", "http://e0"])
    assert "--rollout-engine-urls names the engines behind --rollout-server-urls" in capsys.readouterr().err


def test_ray_mode_of_the_run_scripts(inputs, tmp_path):
    """RAY=1 maps NUM_GPUS / NUM_NODES / ROLLOUT_GPUS / RAY_ARGS onto the job's flags."""
    model, tmp = inputs
    env = _env(RAY="1", DRY_RUN="1", MODEL_DIR=str(model), DATA_DIR=str(tmp / "data"),
               EVAL_SETS="", SAVE_DIR=str(tmp_path / "s"))
    run = lambda **e: subprocess.run(["bash", str(SCRIPT)], env={**env, **e}, text=True,  # noqa: E731
                                     capture_output=True, timeout=60)
    head = run(NUM_GPUS="4").stdout.split(" --hf-checkpoint")[0].split()
    assert head[1:] == ["-m", "trainer.ray_job", "--actor-num-nodes", "1",
                        "--actor-num-gpus-per-node", "4", "--colocate"]
    head = run(NUM_GPUS="4", NUM_NODES="2", ROLLOUT_GPUS="8", RAY_ARGS="--ray-address auto")
    assert head.stdout.split(" --hf-checkpoint")[0].split()[3:] == [
        "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "8",
        "--rollout-num-gpus-per-engine", "1", "--ray-address", "auto"]
    bad = run(ROLLOUT_GPUS="two")
    assert bad.returncode == 1 and "ROLLOUT_GPUS=two is not a non-negative integer" in bad.stderr


def test_bundles_are_ordered_by_node_then_index():
    assert order_bundles({0: "10.0.0.2", 1: "10.0.0.1", 2: "10.0.0.2", 3: "10.0.0.1"}) == [1, 3, 0, 2]


def test_local_gpu_index_follows_cuda_visible_devices():
    assert local_gpu_index([3], None) == 3
    assert local_gpu_index(["5"], "4,5,6") == 1
    assert local_gpu_index([], "0,1") == 0


def test_error_tail_reports_the_error_line():
    class Sink:
        def write(self, text):
            return len(text)

    tail = _ErrorTail(Sink())
    tail.write("rollouts:  50%\rrollouts: 100%\n")
    tail.write("trainer.train: error: rank 1/2: could not reach the store\nbye\n")
    assert tail.last_error() == "trainer.train: error: rank 1/2: could not reach the store"


def test_fault_drill_names_one_engine():
    assert [exit_after(i, "1:8").k for i in range(3)] == [0, 8, 0]
    assert exit_after(0, None).k == exit_after(0, "").k == 0
    with pytest.raises(options.RayJobError, match="expected <engine>:<k>"):
        exit_after(0, "engine0")
    # <engine>:<path>:<k>: the k-th request to that path
    drill = exit_after(0, "0:update_weights_from_tensor:2")
    assert drill.fires("/update_weights_from_tensor", 2) and not drill.fires("/generate", 2)
    assert not exit_after(1, "0:update_weights_from_tensor:2").fires("/update_weights_from_tensor", 2)


def test_restart_hook_only_inside_a_ray_job(monkeypatch):
    monkeypatch.delenv(supervisor.SUPERVISOR_ENV, raising=False)
    assert supervisor.restart_hook_from_env() is None  # plain trainer.train: a dead engine stays down
    monkeypatch.setenv(supervisor.SUPERVISOR_ENV, "engine-supervisor")
    monkeypatch.setenv(supervisor.TIMEOUT_ENV, "270")
    hook = supervisor.restart_hook_from_env(resync=print)
    assert (hook.actor_name, hook.timeout, hook.resync) == ("engine-supervisor", 270.0, print)
    assert supervisor.supervisor_env(120.0) == {supervisor.SUPERVISOR_ENV: "engine-supervisor",
                                                supervisor.TIMEOUT_ENV: "270.0"}


def test_supervisor_replaces_each_death_once_and_gives_up_after_max_restarts(monkeypatch):
    """Which report starts a restart (no Ray here: the replacement itself is stubbed)."""
    sup = supervisor.EngineSupervisor([None, None], ["http://e0", "http://e1"], None, None,
                                      None, 1.0)

    def replace(slot):  # a made-up URL for the replacement (no actor)
        return f"http://e{slot}-{sup.restarts.counts[slot]}"

    monkeypatch.setattr(sup.restarts, "replace", replace)
    assert sup.restart("http://e0/") == "http://e0-1"
    assert sup.restart("http://e0") == "http://e0-1"  # the same death again: no second engine
    assert sup.restart("http://elsewhere") is None
    for k in range(2, supervisor.MAX_RESTARTS + 1):
        assert sup.restart(f"http://e0-{k - 1}") == f"http://e0-{k}"
    assert sup.restart(f"http://e0-{supervisor.MAX_RESTARTS}") is None  # died too often
    assert sup.restarts.counts == [supervisor.MAX_RESTARTS, 0]


@pytest.mark.launch
def test_async_partial_rollouts_on_disaggregated_engines(inputs, tmp_path, jobs):
    """slime's async on Ray: two engine actors generate the next rollout while the trainer actor
    trains (--max-staleness 1, --partial-rollout): every rollout complete, one version behind at
    most, each sample's version recorded."""
    argv = [*_ray_job(inputs, tmp_path / "save", "--rollout-num-gpus", "2"), "--num-rollout", "3",
            "--max-staleness", "1", "--partial-rollout", "--engine-start-timeout", "120",
            "--save-debug-rollout-data", str(tmp_path / "debug" / "rollout_{rollout_id}.jsonl")]
    rc, log, left = jobs(argv, _env(), tmp_path / "job.log").finish()
    assert rc == 0, log[-4000:]
    metrics = _metrics(tmp_path / "save")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["rollout/staleness_max"] <= 1 for m in metrics)
    assert any(m["rollout/staleness_max"] == 1 for m in metrics[1:])  # generated during training
    samples = _samples(tmp_path / "debug")
    assert [len(rows) for rows in samples] == [10, 10, 10]
    assert {r["weight_version"] for r in samples[2]} <= {"rollout-1", "rollout-2"}
    assert left == [], left
