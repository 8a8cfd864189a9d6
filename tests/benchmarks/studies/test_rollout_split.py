"""benchmarks.studies.rollout_split on a CPU (tiny shape, long_rollout's R-KV engine): the probed
rollout gives the same tokens and log-probs as the same requests unprobed, its split counts what
the requests imply (one prefill step for samples admitted together, the longest sample's decode
steps, every response built once, compactions at the divide length), the probes are put back,
and the profile writes its two kernel tables."""

from __future__ import annotations

import pytest

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.engine import rollout_profile
from benchmarks.studies import rollout_split
from benchmarks.studies import long_rollout

FLAGS = ["--shape", "tiny", "--prompts", "2", "--samples", "2", "--prompt-len", "16",
         "--response-len", "96", "--profile-context", "64", "--configs", "rkv:16"]


@pytest.fixture(scope="module")
def rkv_engine(tmp_path_factory):
    work = tmp_path_factory.mktemp("split")
    args = rollout_split.parse_args(FLAGS + ["--profile", str(work / "prof")])
    args.divide_length = 16
    hf = build_checkpoint("tiny", work / "hf")
    targs = rollout_split.trainer_namespace(args, long_rollout.parse_config("rkv:16"), hf, work / "w")
    engine = rollout_split.start_engine(targs)
    yield engine, targs, args, work
    engine.shutdown()


def prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % 400 + 2 for j in range(length)] for i in range(n)]


@pytest.mark.slow
def test_probed_rollout_matches_the_plain_one(rkv_engine):
    engine, targs, args, _ = rkv_engine
    rcfg = rollout_split.rollout_config(targs, args)
    reqs = rollout_split.requests(args, rcfg, prompts(2, 16), warmup=False)
    plain = rollout_split.run_rollout(engine, reqs, rcfg)
    split, probed = rollout_split.timed_rollout(engine, reqs, rcfg)
    assert [g.response_ids for g in probed] == [g.response_ids for g in plain]
    assert [g.logprobs for g in probed] == [g.logprobs for g in plain]
    assert "build" not in vars(engine.loop.outputs)
    assert "after_step" not in vars(engine.runner.compressor)
    wanted = [r.sampling_params["max_new_tokens"] for r in reqs]
    assert all(len(g.response_ids) <= n for g, n in zip(probed, wanted))
    longest = max(len(g.response_ids) for g in probed)
    # R-KV's bound fits the pool: all four in one prefill step (their first tokens), then the
    # longest one's steps (one more if it ended on a stop id: overlap launches the next step)
    assert split["preemptions"] == 0 and split["prefill_steps"] == 1
    assert split["decode_steps"] in (longest - 1, longest) and split["longest"] == longest
    assert split["builds"]["count"] == 4 and split["samples"] == 4
    assert split["tokens"] == sum(len(g.response_ids) for g in probed)
    per_sample = sum(g.meta["compression"]["num_compressions"] for g in probed)
    assert 0 < split["compression"]["events"] <= per_sample  # an event compacts one or more
    assert split["compression"]["gpu_span_ms"] is None  # no CUDA on a CPU
    assert split["wall_s"] >= split["decode_s"] > 0
    # every decode step in one band of its batch size (4 running, then fewer as samples end)
    assert sum(b["steps"] for b in split["by_batch"]) == split["decode_steps"]
    assert [b["batch"] for b in split["by_batch"]] == ["1-16"] and split["by_batch"][0]["graph_gpu_ms"] is None
    assert "launch" not in vars(engine.runner)


@pytest.mark.slow
def test_profile_writes_the_decode_window_and_one_compression(rkv_engine):
    engine, targs, args, work = rkv_engine
    rcfg = rollout_split.rollout_config(targs, args)
    reqs = rollout_split.requests(args, rcfg, prompts(2, 16), warmup=False)
    out = rollout_profile.profile_rollout(engine, prompts(2, 16), reqs, args, "rkv")
    assert out["decode"]["steps"] == 16 and out["decode"]["torch_ops_per_step"] > 0
    assert out["compression"] == {"profiled": True}
    names = sorted(p.name for p in (work / "prof").glob("*_kernels.txt"))
    assert names == ["rkv_compression_kernels.txt", "rkv_decode_kernels.txt"]
    assert "aten::" in (work / "prof" / "rkv_compression_kernels.txt").read_text()
    assert "compress" not in vars(engine.runner.compressor)


def test_bad_config_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        rollout_split.parse_args(["--configs", "rkv"])


class FakeEvent:
    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, end) -> float:
        return end.ms - self.ms


def test_by_batch_bands_hand_computed():
    sizes = [256, 200, 150, 100, 100, 10]
    steps = [(0.001, 0.002, 0.0), (0.001, 0.001, 0.0), (0.002, 0.0, 0.0), (0.001, 0.0, 0.0),
             (0.003, 0.0, 0.0), (0.0005, 0.0005, 0.0)]
    pairs = [(FakeEvent(0.0), FakeEvent(ms)) for ms in (2.5, 2.0, 1.5, 1.0, 3.0, 0.5)]
    rows = rollout_split.by_batch(sizes, steps, pairs)
    assert [(r["batch"], r["steps"]) for r in rows] == [("193-256", 2), ("129-192", 1), ("65-128", 2),
                                                        ("1-16", 1)]
    assert rows[0]["step_ms"] == pytest.approx(2.5) and rows[0]["host_ms"] == pytest.approx(1.0)
    assert rows[0]["graph_gpu_ms"] == pytest.approx(2.25)
    assert rows[2]["step_ms"] == pytest.approx(2.0) and rows[2]["graph_gpu_ms"] == pytest.approx(2.0)
    # a step without a graph replay: the pairs no longer align, no GPU column
    assert all(r["graph_gpu_ms"] is None for r in rollout_split.by_batch(sizes, steps, pairs[:-1]))
