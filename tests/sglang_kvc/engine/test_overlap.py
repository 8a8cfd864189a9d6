"""Overlap scheduling: step N+1 is launched before step N's tokens are read, and every output is
the same as when each step is read before the next (`--disable-overlap-schedule`)."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.io_struct import parse_generate
from sglang_kvc.engine.row_state import RowState


def make(tiny_models, overlap: bool, **kw) -> Engine:
    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32",
                  disable_overlap_schedule=not overlap, **kw)


def request_mix(eng: Engine) -> list[tuple[list[int], dict, dict]]:
    """(input_ids, sampling params, extra generate kwargs) covering every way a request ends,
    with stop ids / strings taken from what the model really generates, so they do fire."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12, 3)]
    greedy = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    probe = eng.generate(input_ids=ids[0], sampling_params=greedy)
    stop_tok = probe["output_ids"][5]
    stop_str = eng.tokenizer.decode(probe["output_ids"][8:10])
    seeded = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "max_new_tokens": 20,
              "sampling_seed": 3, "ignore_eos": True}
    logprobs = {"return_logprob": True, "top_logprobs_num": 3}
    return [
        (ids[0], greedy, logprobs),
        (ids[0], dict(greedy, stop_token_ids=[stop_tok]), {}),
        (ids[0], dict(greedy, stop=[stop_str]), {}),
        (ids[0], dict(greedy, stop_token_ids=[stop_tok], min_new_tokens=7), logprobs),
        (ids[1], dict(seeded, n=2), logprobs),
        (ids[2], dict(greedy, max_new_tokens=1), {}),
        (ids[3], dict(greedy, max_new_tokens=0), {}),
        (ids[4], {"temperature": 0.7, "max_new_tokens": 30, "sampling_seed": 11}, {}),  # EOS on
        (ids[5], dict(seeded, min_p=0.05, max_new_tokens=33), {}),
    ]


def run_mix(eng: Engine, mix) -> list[dict]:
    """Submit everything at once (requests share batches and end at different steps)."""
    futures = []
    for ids, params, kw in mix:
        items, _ = parse_generate({"input_ids": ids, "sampling_params": params, **kw})
        futures += eng.submit(items)
    return [f.result() for f in futures]


def assert_same(got: list[dict], want: list[dict], tol: float = 1e-4) -> None:
    """Tokens, text and finish reason exactly; logprobs to 1e-4 (a request's batch-mates differ
    between the modes, since an ended request rides one more step, and a batch of another size
    may round fp32 matmuls differently; preemption recomputes KV with the prefill kernels)."""
    for g, w in zip(got, want, strict=True):
        gm, wm = g["meta_info"], w["meta_info"]
        assert (g["output_ids"], g["text"], gm["finish_reason"]) == (
            w["output_ids"], w["text"], wm["finish_reason"])
        pairs = list(zip(gm.get("output_token_logprobs") or [], wm.get("output_token_logprobs") or []))
        for gt, wt in zip(gm.get("output_top_logprobs") or [], wm.get("output_top_logprobs") or []):
            pairs += list(zip(gt, wt, strict=True))
        for (glp, gid, _), (wlp, wid, _) in pairs:
            assert gid == wid and abs(glp - wlp) < tol, (glp, gid, wlp, wid)


@pytest.mark.parametrize("extra", [
    {},
    {"max_total_tokens": 64, "max_running_requests": 4},  # preemption and a full slot table
    {"compress_algorithm": "rkv", "compress_max_prompt": 12, "compress_divide_length": 4,
     "compress_max_window": 3},
    {"compress_algorithm": "snapkv", "compress_max_prompt": 10, "compress_divide_length": 6,
     "compress_max_window": 2, "compress_divide_method": "newline"},
], ids=["dense", "preempt", "rkv", "snapkv-newline"])
def test_overlap_outputs_equal_sequential(tiny_models, extra):
    with make(tiny_models, overlap=False, **extra) as seq_eng:
        mix = request_mix(seq_eng)
        want = run_mix(seq_eng, mix)
    with make(tiny_models, overlap=True, **extra) as ov_eng:
        got = run_mix(ov_eng, mix)
        info = ov_eng.get_server_info()
    assert_same(got, want)
    reasons = {o["meta_info"]["finish_reason"]["type"] for o in want}
    assert reasons == {"stop", "length"}  # both ways of ending really happened
    if "max_total_tokens" in extra:
        assert info["num_preemptions"] > 0
    assert info["overlap_schedule"] and info["step_stats"]["decode_steps"] > 0


def trace_steps(eng: Engine) -> list[tuple[str, int]]:
    """Record ("launch", step id) and ("read", step id) in the order the engine does them."""
    events, launch = [], eng.runner.launch

    def traced_launch(batch):
        step = launch(batch)
        sid = len([e for e in events if e[0] == "launch"])
        events.append(("launch", sid))
        result = step.result

        def traced_result():
            events.append(("read", sid))
            return result()

        step.result = traced_result
        return step

    eng.runner.launch = traced_launch
    return events


@pytest.mark.parametrize("overlap", [True, False])
def test_next_step_launches_before_previous_is_read(tiny_models, overlap):
    with make(tiny_models, overlap=overlap) as eng:
        events = trace_steps(eng)
        seqs = []
        sample = eng.runner.launch

        def keep(batch):
            seqs.extend(s for s in batch.seqs if s not in seqs)
            return sample(batch)

        eng.runner.launch = keep
        outs = eng.generate(input_ids=[[5, 6, 7], [8, 9]], sampling_params={
            "temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True})
    assert all(len(o["output_ids"]) == 12 for o in outs)
    # A limit the host knows in advance never costs an extra step: 12 tokens sampled, not 13.
    assert [s.num_sampled for s in seqs] == [12, 12]
    launches_before_read = [sum(1 for e in events[:events.index(("read", i))] if e[0] == "launch")
                            for i in range(len(events) // 2)]
    if overlap:  # step i is read after step i + 1 was launched (but the last)
        assert launches_before_read[:-1] == [i + 2 for i in range(len(launches_before_read) - 1)]
    else:
        assert launches_before_read == [i + 1 for i in range(len(launches_before_read))]


def test_row_state_stop_flags():
    rs = RowState(num_rows=5, device=torch.device("cpu"), width=2)
    rs.admit(torch.tensor([1, 3]), [[7], [2, 4, 9]])  # three ids: the table widens
    rs.admit(torch.tensor([2]), [[]])
    assert rs.stop_ids.shape[1] == 3
    hits = rs.record(torch.tensor([1, 2, 3]), torch.tensor([7, 7, 4]))
    assert hits.tolist() == [True, False, True]
    assert rs.record(torch.tensor([3]), torch.tensor([5])).tolist() == [False]
    assert rs.last_token.tolist() == [0, 7, 7, 5, 0]


def test_engine_thread_death_fails_requests_instead_of_hanging(tiny_models):
    """An error outside a step's own error handling ends the thread: every request in flight and
    every later call gets an error at once rather than waiting forever."""
    with make(tiny_models, overlap=True) as eng:
        def broken(batch, out):
            raise KeyError("boom")

        eng.loop._process = broken
        out = eng.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4})
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert "engine died" in out["meta_info"]["finish_reason"]["message"]
        with pytest.raises(RuntimeError, match="shut down"):
            eng.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4})
