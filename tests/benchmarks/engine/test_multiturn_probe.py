"""benchmarks/engine/multiturn_probe.py and multiturn_profile.py on the tiny model (CPU): the
probe records each prefill step's rows, continuing rows, new tokens and held KV as computed by
hand from the prompts; with it installed the engine returns the same greedy tokens as without;
a profile started on the engine thread sees the engine's ops and cuts out the continuation step.
Timings are only checked to be there."""

from __future__ import annotations

import pytest

from benchmarks.engine.multiturn_probe import StepProbe, one_look, profiled, step_summary
from benchmarks.engine.multiturn_profile import one_look as profile_look

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 3}
FIRST = [list(range(3, 14)), list(range(30, 37))]  # 11 and 7 tokens
NEXT = [list(range(50, 55)), list(range(60, 63))]  # 5 and 3 new tokens


def _two_turns(eng, probe=None, prof_dir=None):
    """Two sessions: turn 1 (FIRST), then each continues with NEXT. Returns the tokens and,
    with a probe, each turn's recorded prefill steps."""
    sids = eng.open_sessions(2)
    steps, tokens = [], []
    for turn, ids in enumerate((FIRST, NEXT)):
        sess = [{"id": s} for s in sids] if turn == 0 else \
            [{"id": s, "rid": r["meta_info"]["id"]} for s, r in zip(sids, out)]
        if probe is not None:
            probe.enabled = True
        run = lambda: eng.generate(input_ids=ids, sampling_params=GREEDY,  # noqa: E731
                                   session_params=sess)
        out, tables = (profiled(eng.loop, run, prof_dir, False) if turn and prof_dir
                       else (run(), None))
        if probe is not None:
            probe.enabled = False
            steps.append(probe.take())
        tokens.append([r["output_ids"] for r in out])
    eng.close_sessions(sids)
    return tokens, steps, tables


@pytest.fixture
def engine(tiny_model_factory):
    from sglang_kvc import Engine

    path = str(tiny_model_factory("qwen2.5"))

    def make():
        return Engine(model_path=path, device="cpu", dtype="float32", random_seed=0)
    return make


def test_probe_records_each_prefill_as_computed_by_hand(engine, tmp_path):
    with engine() as eng:
        plain, _, _ = _two_turns(eng)
    with engine() as eng:
        probe = StepProbe(eng.loop)
        tokens, (turn1, turn2), tables = _two_turns(eng, probe, tmp_path / "prof")
    assert tokens == plain  # the probe changes nothing the engine computes
    assert len(turn1) == 1 and len(turn2) == 1
    fresh, cont = turn1[0], turn2[0]
    assert (fresh["rows"], fresh["continuations"], fresh["tokens"], fresh["max_new"],
            fresh["max_held"]) == (2, 0, 11 + 7, 11, 0)
    # a continuation computes its new tokens and the last token turn 1 sampled (its KV was
    # never computed); it holds its prompt and the two other sampled tokens: 11 + 2 slots
    assert (cont["rows"], cont["continuations"], cont["tokens"], cont["max_new"],
            cont["max_held"]) == (2, 2, (5 + 1) + (3 + 1), 6, 11 + 2)
    for step in (fresh, cont):
        assert step["wall_ms"] >= step["launch_ms"] > 0 and step["thread_cpu_ms"] >= 0
    s = step_summary(turn1 + turn2)
    assert (s["continuation_steps"], s["fresh_steps"], s["continuation_tokens_median"]) == (1, 1, 10)
    assert "1 continuation prefill steps" in one_look(s)
    # the profile ran on the engine thread: the continuation step and the model's ops in it
    assert tables["continuation"]["steps"] == 1 and tables["fresh"]["steps"] == 0
    names = [n for n, _ in tables["continuation"]["top_ops"]]
    assert any(n.startswith("aten::") for n in names)
    assert "1 continuation prefill steps" in profile_look(tables)
    text = (tmp_path / "prof" / "prefill_ops.txt").read_text()
    assert "1 continuation prefill steps" in text and "0 fresh prefill steps" in text
    assert "aten::" in (tmp_path / "prof" / "cpu_ops.txt").read_text()


def test_python_profile_of_launches_names_the_forward(engine):
    """With a cProfile set, the probe profiles the prefill launches (on the engine thread) and
    its text names the model's forward, which every prefill launch calls."""
    from benchmarks.engine.multiturn_probe import python_profile_text
    import cProfile

    with engine() as eng:
        probe = StepProbe(eng.loop)
        probe.python_profile = cProfile.Profile()
        _two_turns(eng, probe)
        text = python_profile_text(probe.python_profile)
    assert "by cumulative" in text and "by tottime" in text
    assert "forward" in text


def test_kernel_rows_of_key_averages_use_their_key():
    """key_averages() rows (FunctionEventAvg) carry .key and no .name; CUDA rows are kernels
    unless they are CUDA runtime calls."""
    from types import SimpleNamespace

    from benchmarks.engine.multiturn_profile import whole_run

    avg = lambda key, dev, us: SimpleNamespace(key=key, device_type=dev, count=2,  # noqa: E731
                                               self_device_time_total=us, self_cpu_time_total=us)
    kernels, ops = whole_run([avg("_stage1", "DeviceType.CUDA", 3000.0),
                              avg("cudaLaunchKernel", "DeviceType.CUDA", 10.0),
                              avg("aten::mm", "DeviceType.CPU", 500.0)])
    assert kernels == [("_stage1", 2, 3.0)]
    assert [name for name, _, _ in ops] == ["aten::mm", "cudaLaunchKernel"]
