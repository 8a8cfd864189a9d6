"""The engine with KV compression: dense equivalence, bounded memory, admission, triggers,
π_sparse logprobs (checked against HF with the attention mask compression implies), stats."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.compression import CompressionConfig
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.io_struct import parse_generate
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def make_engine(tiny_models, name="qwen2.5", **kw):
    return Engine(model_path=str(tiny_models[name]), device="cpu", **kw)


def prompts_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (n,), generator=g).tolist() for n in lengths]


def watch_steps(engine, check):
    """Call check(engine) after every engine step's compression (on the engine thread)."""
    after_step = engine.runner.after_step

    def wrapped(batch):
        after_step(batch)
        check(engine, batch)

    engine.runner.after_step = wrapped


@pytest.mark.parametrize("algo", ["rkv", "snapkv", "streamingllm"])
def test_budget_above_every_sequence_is_dense(tiny_models, algo):
    ids = prompts_of([5, 17, 30])
    params = dict(GREEDY, max_new_tokens=20)
    with make_engine(tiny_models) as dense:
        want = dense.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=64,
                     compress_divide_length=8) as eng:
        got = eng.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    for g, w in zip(got, want):
        assert g["output_ids"] == w["output_ids"]
        assert [x[0] for x in g["meta_info"]["output_token_logprobs"]] == \
            [x[0] for x in w["meta_info"]["output_token_logprobs"]]
        assert g["meta_info"]["compression"]["num_compressions"] == 0


@pytest.mark.parametrize("algo", ["rkv", "snapkv", "streamingllm"])
def test_request_with_compress_false_is_dense_on_a_compressing_engine(tiny_models, algo):
    """`compress: false` (a dense evaluation on the rollout engine): that request's tokens and
    log-probs are the dense engine's, while its batch-mates in the same batch still compress."""
    ids = prompts_of([5, 17, 30], seed=1)
    params = dict(temperature=1.0, ignore_eos=True, max_new_tokens=40, sampling_seed=7)
    with make_engine(tiny_models) as dense:
        want = dense.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=12,
                     compress_divide_length=4, compress_max_window=3) as eng:
        items, _ = parse_generate({"input_ids": ids + ids, "sampling_params": params,
                                   "return_logprob": True, "compress": [False] * 3 + [True] * 3},
                                  eng.sampling_defaults)
        outs = [f.result() for f in eng.submit(items)]
    for g, w in zip(outs[:3], want):
        assert g["output_ids"] == w["output_ids"]
        # a batch of other shapes: fp32 sums in other orders
        assert max(abs(a[0] - b[0]) for a, b in zip(g["meta_info"]["output_token_logprobs"],
                                                    w["meta_info"]["output_token_logprobs"])) < 1e-5
        assert g["meta_info"]["compression"]["num_compressions"] == 0
    assert all(o["meta_info"]["compression"]["num_compressions"] > 0 for o in outs[3:])
    with pytest.raises(ValueError, match="compress must be a boolean"):
        parse_generate({"input_ids": ids[0], "compress": "no"})


@pytest.mark.parametrize("algo,compress_prompt", [("rkv", False), ("rkv", True),
                                                  ("snapkv", False), ("streamingllm", True)])
def test_pool_usage_never_exceeds_bound(tiny_models, algo, compress_prompt):
    B, N = 16, 8
    lengths = [4, 12, 20, 30, 9, 40]  # some prompts above B and above B + N
    violations = []

    def check(eng, batch):
        running = eng.scheduler.running
        used = eng.kv.capacity - eng.kv.num_free
        assert used == sum(s.kv_len for s in running)
        for s in running:
            P = len(s.prompt_ids)
            limit = (B + N) if compress_prompt else max(P + 1, B + N)
            if s.kv_len > limit or s.kv_len > P + B + N:
                violations.append((s.rid, s.kv_len, P))
        if used > sum(eng.compressor.bound(s, s.kv_len) for s in running):
            violations.append(("pool", used))

    with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=4,
                     compress_prompt=compress_prompt, max_total_tokens=400) as eng:
        watch_steps(eng, check)
        outs = eng.generate(input_ids=prompts_of(lengths), sampling_params=dict(GREEDY, max_new_tokens=50))
        assert not violations, violations[:5]
        assert all(len(o["output_ids"]) == 50 for o in outs)
        for o, P in zip(outs, lengths):
            c = o["meta_info"]["compression"]
            assert c["num_compressions"] > 0
            # The prefill itself holds the whole prompt for one step, compressed or not.
            assert c["peak_kv_slots"] <= (max(P, B + N) if compress_prompt else max(P + 1, B + N))
            assert c["peak_kv_slots"] - c["tokens_evicted"] <= B + N
        assert eng.scheduler.num_preemptions == 0
        info = eng.get_server_info()
        assert info["kv_pool"]["used"] == 0 and info["kv_pool"]["peak_used"] <= 400
        assert info["compression"]["num_compressions"] == sum(
            o["meta_info"]["compression"]["num_compressions"] for o in outs)


def test_workload_that_cannot_fit_densely_runs_concurrently(tiny_models):
    n_req, P, M, pool = 8, 10, 80, 300
    assert n_req * (P + M) > pool  # densely they cannot all be resident
    ids = prompts_of([P] * n_req, seed=3)
    params = dict(GREEDY, max_new_tokens=M)
    stats = {}
    for algo in (None, "rkv"):
        with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=16,
                         compress_divide_length=8, compress_max_window=4,
                         max_total_tokens=pool) as eng:
            outs = eng.generate(input_ids=ids, sampling_params=params)
            assert all(len(o["output_ids"]) == M for o in outs)
            sch = eng.scheduler
            stats[algo] = (sch.max_running, sch.decode_seq_steps / sch.decode_steps, sch.num_preemptions)
    dense, rkv = stats[None], stats["rkv"]
    assert rkv[0] == n_req and rkv[2] == 0  # all at once, never preempted
    assert dense[2] > 0  # dense had to evict whole requests and recompute them
    assert rkv[1] > 1.5 * dense[1], stats  # mean decode batch
    assert rkv[1] > n_req - 0.5


def compression_events(eng):
    events = []
    compress = eng.compressor.compress

    def spy(seqs):
        for s in seqs:
            events.append((s.rid, len(s.output_ids), s.kv_len, s.all_ids[s.num_computed - 1]))
        return compress(seqs)

    eng.compressor.compress = spy
    return events


def test_step_length_trigger_fires_every_divide_length(tiny_models):
    B, N, P, M = 16, 8, 10, 60
    with make_engine(tiny_models, compress_algorithm="snapkv", compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=4) as eng:
        events = compression_events(eng)
        out = eng.generate(input_ids=prompts_of([P])[0], sampling_params=dict(GREEDY, max_new_tokens=M))
    # Decode step d (d output tokens so far) leaves P + d held before compaction: the first
    # compression at P + d = B + N, then every N steps.
    ds = [e[1] for e in events]
    first = B + N - P
    assert ds == list(range(first, M, N))
    assert all(e[2] == B + N for e in events)
    assert out["meta_info"]["compression"]["num_compressions"] == len(ds)
    assert out["meta_info"]["compression"]["tokens_evicted"] == len(ds) * N


def test_newline_trigger_fires_after_newline_token(tiny_models):
    B, N, P, M = 16, 12, 10, 50
    with make_engine(tiny_models, compress_algorithm="rkv", compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=4,
                     compress_divide_method="newline") as eng:
        nl = eng.tokenizer.encode("\n", add_special_tokens=False)[-1]
        assert nl in eng.compressor.trigger.newline_ids
        assert not set(prompts_of([P])[0]) & eng.compressor.trigger.newline_ids
        forced = {3, 9, 20, 21, 40}  # output indices sampled as a newline
        sampler = eng.runner.sampler

        def force(logits, sb):
            out = sampler(logits, sb)
            for i, step in enumerate(sb.steps.tolist()):
                if step in forced:
                    out.ids[i] = nl
            return out

        eng.runner.sampler = force
        events = compression_events(eng)
        out = eng.generate(input_ids=prompts_of([P])[0], sampling_params=dict(GREEDY, max_new_tokens=M))
    ids = out["output_ids"]
    assert [ids[k] == nl for k in sorted(forced)] == [True] * len(forced)
    nl_set = eng.compressor.trigger.newline_ids
    # Replay the rule: after decode step d the fed token is output d-1 and P + d are held
    # (or B + steps since the last compaction).
    expected, held = [], P
    for d in range(1, M):
        held += 1
        if held > B and (ids[d - 1] in nl_set or held >= B + N):
            expected.append(d)
            held = B
    assert [e[1] for e in events] == expected
    newline_fired = [d for d in expected if ids[d - 1] in nl_set]
    assert newline_fired and any(ids[d - 1] not in nl_set for d in expected)  # the cap too
    assert 4 not in expected  # output 3 fed at step 4 with only 14 held: nothing to do
    assert all(e[3] == ids[e[1] - 1] for e in events)


def _streaming_mask(P, total, B, N, sinks, compress_prompt):
    """Which positions each query attends when StreamingLLM runs in the engine."""
    mask = torch.zeros(total, total, dtype=torch.bool)
    for i in range(P):
        mask[i, :i + 1] = True
    held = list(range(P))

    def squeeze(h):
        return h[:sinks] + h[len(h) - (B - sinks):]

    if compress_prompt and len(held) > B:
        held = squeeze(held)
    for i in range(P, total):
        mask[i, held + [i]] = True
        held.append(i)
        if len(held) >= B + N:
            held = squeeze(held)
    return mask


@pytest.mark.parametrize("family,P,compress_prompt", [("qwen2.5", 9, False), ("qwen3", 22, True),
                                                      ("llama3", 30, False)])
def test_streamingllm_logprobs_are_the_sparse_forward(tiny_models, hf_reference, family, P,
                                                      compress_prompt):
    """The returned logprobs (π_sparse) equal an HF forward whose attention mask keeps exactly
    what the engine kept: the sinks and the recent tokens, recomputed from the trigger rule."""
    B, N, S, M, T = 12, 6, 4, 30, 0.8
    ids = prompts_of([P], seed=7)[0]
    with make_engine(tiny_models, family, compress_algorithm="streamingllm", compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=2, compress_num_sink=S,
                     compress_prompt=compress_prompt) as eng:
        out = eng.generate(input_ids=ids, sampling_params={
            "temperature": T, "max_new_tokens": M, "ignore_eos": True, "sampling_seed": 5},
            return_logprob=True)
    gen = out["output_ids"]
    full = ids + gen
    mask = _streaming_mask(P, len(full) - 1, B, N, S, compress_prompt)
    model = hf_reference.model(tiny_models[family])
    x = torch.tensor([full[:-1]])
    am = torch.where(mask, 0.0, float("-inf"))[None, None]
    with torch.no_grad():
        logits = model(x, attention_mask=am).logits[0].float()
    lp = torch.log_softmax(logits / T, dim=-1)
    want = [lp[P - 1 + k, t].item() for k, t in enumerate(gen)]
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(want, abs=2e-4)
    # ... and they differ from the dense forward once compression has happened.
    with torch.no_grad():
        dense = torch.log_softmax(model(x).logits[0].float() / T, dim=-1)
    dense_lp = [dense[P - 1 + k, t].item() for k, t in enumerate(gen)]
    assert max(abs(a - b) for a, b in zip(got, dense_lp)) > 1e-3
    assert out["meta_info"]["compression"]["num_compressions"] >= 3


def _seq(prompt_len, out_ids, max_new=100):
    s = Sequence(rid="r", prompt_ids=list(range(100, 100 + prompt_len)),
                 params=SamplingParams(max_new_tokens=max_new), seed=0)
    s.output_ids = list(out_ids)
    # The state the trigger sees: the step's tokens are computed, its sample not yet appended.
    s.num_computed = s.kv_len = s.num_tokens
    return s


def test_trigger_rules_and_think_stop():
    cfg = CompressionConfig(algorithm="rkv", budget=16, window=4, divide_length=8,
                            divide_method="newline")
    t = Trigger(cfg, newline_ids={7}, think_end_id=9)
    s = _seq(3, [7, 8])  # the trigger reads tokens by index, never building prompt + output
    assert [s.token_at(i) for i in range(5)] == s.all_ids == [100, 101, 102, 7, 8]
    # prompt 10: the fed token is the last output; held = prompt + outputs
    assert not t.should_compress(_seq(10, [1] * 6 + [7, 1]), False)  # 18 held, fed 1
    assert t.should_compress(_seq(10, [1] * 7 + [7]), False)  # newline fed, 18 > B
    assert not t.should_compress(_seq(10, [1] * 5 + [7]), False)  # newline, only 16 held
    assert not t.should_compress(_seq(10, [1] * 13), False)  # 23 held
    assert t.should_compress(_seq(10, [1] * 14), False)  # 24 = B + N: the cap
    assert not t.should_compress(_seq(20, []), True)  # prefill, prompt compression off
    assert t.should_compress(_seq(20, [1, 1]), True)  # recomputed after preemption
    s = _seq(10, [1] * 12 + [9])
    assert t.bound(s, s.kv_len) == 24
    t.observe(s)
    assert s.compress_stopped and not t.should_compress(s, False)
    assert t.bound(s, s.kv_len) == 23 + 100 - 13  # grows densely from here
    with pytest.raises(ValueError, match="--compress-divide-method"):
        Trigger(cfg, newline_ids=None)
    # stop_after_think off: the marker is ignored
    t2 = Trigger(CompressionConfig(algorithm="rkv", budget=16, window=4, stop_after_think=False),
                 think_end_id=9)
    s = _seq(10, [1] * 12 + [9])
    t2.observe(s)
    assert not s.compress_stopped


def test_newline_without_tokenizer_fails_at_startup(tiny_models):
    with pytest.raises(ValueError, match="--compress-divide-method"):
        make_engine(tiny_models, compress_algorithm="rkv", compress_divide_method="newline",
                    skip_tokenizer_init=True)
