"""The key check of eviction replay: the trainer's Megatron forward under the engine's eviction
records reproduces the compressed sampler's log-probs (CPU, fp32) for R-KV, SnapKV and
StreamingLLM, per-head and per-layer selection, prompt compression on and off; the dense
recompute does not."""

from __future__ import annotations

import dataclasses

import torch

from checkpoint_tools import cpu_megatron

T = 0.8
CASES = [  # (algorithm, selection, compress the prompt at prefill)
    ("rkv", "head", False), ("rkv", "layer", True), ("snapkv", "head", True),
    ("snapkv", "layer", False), ("streamingllm", "head", False), ("streamingllm", "head", True),
]


def engine_samples(hf, algo, selection, compress_prompt):
    """Samples (with their eviction records) and the engine's log-probs of them."""
    from sglang_kvc.engine.engine import Engine
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(len(algo) + compress_prompt)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (6, 17, 23)]
    prompts.append(prompts[1])  # prefix sharing: prefilled once, its slots copied on compaction
    with Engine(model_path=str(hf), device="cpu", compress_algorithm=algo,
                compress_max_prompt=10, compress_divide_length=5, compress_max_window=3,
                compress_num_sink=2, compress_prompt=compress_prompt,
                compress_selection=selection) as eng:
        outs = eng.generate(input_ids=prompts, return_logprob=True, return_eviction_record=True,
                            sampling_params={"temperature": T, "max_new_tokens": 36,
                                             "ignore_eos": True, "sampling_seed": 11})
    samples = [Sample(p, o["output_ids"], o["meta_info"]["eviction_record"])
               for p, o in zip(prompts, outs)]
    assert all(o["meta_info"]["compression"]["num_compressions"] >= 3 for o in outs)
    assert all(o["meta_info"]["eviction_record_exact"] for o in outs)
    return samples, [torch.tensor([x[0] for x in o["meta_info"]["output_token_logprobs"]])
                     for o in outs]


def preempted_sample(hf):
    """A sample that compressed twice, stopped compressing (as after </think>) and was then
    preempted: readmitted, it is recomputed densely (every K/V anew) from dense_from on."""
    import time

    from sglang_kvc.engine.engine import Engine
    from sglang_kvc.engine.io_struct import parse_generate
    from trainer.learner.packing import Sample

    prompt = torch.randint(3, 200, (7,), generator=torch.Generator().manual_seed(5)).tolist()
    with Engine(model_path=str(hf), device="cpu", compress_algorithm="rkv",
                compress_max_prompt=10, compress_divide_length=5, compress_max_window=3) as eng:
        items, _ = parse_generate({"input_ids": prompt, "return_logprob": True,
                                   "return_eviction_record": True, "sampling_params": {
                                       "temperature": T, "max_new_tokens": 60,
                                       "ignore_eos": True, "sampling_seed": 3}},
                                  eng.sampling_defaults)
        fut = eng.submit(items)[0]
        running = eng.scheduler.running
        while not eng.loop.call(lambda: bool(running) and running[0].num_compressions >= 2):
            time.sleep(0.001)

        def stop_compressing_and_preempt():
            running[0].compress_stopped = True
            eng.scheduler.retract_all()

        eng.loop.call(stop_compressing_and_preempt)
        meta = fut.result()["meta_info"]
    assert meta["eviction_record_exact"] and meta["num_preemptions"] == 1
    sample = Sample(prompt, [x[1] for x in meta["output_token_logprobs"]], meta["eviction_record"],
                    meta["eviction_record_dense_from"])
    lp = torch.tensor([x[0] for x in meta["output_token_logprobs"]])
    return sample, lp, meta["eviction_record_dense_from"] - len(prompt) + 1  # first dense token


def replay_task(rank, world, port, hf_dir, cache, cases, tp=1):
    """Per case: (sparse, dense) per-sample response log-probs of one packed micro-batch."""
    from trainer.learner.forward import packed_logprobs
    from trainer.learner.model_provider import ModelConfig, build_policy_model
    from trainer.learner.attention import SDPACoreAttention
    from trainer.learner.packing import pack

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=tp)
    arch, model = build_policy_model(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                                     cache_dir=cache)
    def logprobs(samples, sparse):
        batch = pack(samples, sparse=sparse, pad_to_multiple=8).to(cpu_megatron.default_device())
        with torch.no_grad():
            lp, _ = packed_logprobs(model.eval(), batch, temperature=T, vocab_size=arch.vocab_size)
        return [x.cpu() for x in batch.split_per_sample(lp)]

    results = [(logprobs(samples, True), logprobs(samples, False)) for samples in cases]
    other = {}
    for impl in ("flex",):  # the GPU path, FlexAttention unfused on the CPU
        SDPACoreAttention.sparse_impl = impl
        other[impl] = logprobs(cases[0], True)
    return results, other


def test_sparse_recompute_equals_the_engines_logprobs(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2.5")
    cases = [engine_samples(hf, *c) for c in CASES]
    preempted, preempted_lp, first_dense = preempted_sample(hf)
    one_forward = dataclasses.replace(preempted, eviction_dense_from=None)
    ((results, flex),) = cpu_megatron.run_on_ranks(
        (__file__, "replay_task"), 1, str(hf), str(tmp_path / "c"),
        [s for s, _ in cases] + [cases[0][0] + [preempted], [one_forward]])
    (two_copies, _), (masked_only, _) = results[-2:]
    results = results[:-2]
    # preempted after evicting: masked replay before the engine's dense recompute, dense after
    # (the sample packed twice, between other samples), exact throughout
    where = f"dense from response token {first_dense} of {len(preempted_lp)}"
    gap = (two_copies[-1] - preempted_lp).abs()
    assert gap.max() < 1e-5, (where, gap)
    assert max((a - b).abs().max() for a, b in zip(two_copies[:-1], cases[0][1])) < 1e-5
    # one masked forward is exact only up to the recompute: its K/V there differ
    gap = (masked_only[0] - preempted_lp).abs()
    assert gap[:first_dense].max() < 1e-5 and gap[first_dense:].max() > 1e-3, (where, gap)
    for case, (_, engine_lp), (sparse, dense) in zip(CASES, cases, results):
        gap_sparse = max((a - b).abs().max().item() for a, b in zip(sparse, engine_lp))
        gap_dense = max((a - b).abs().max().item() for a, b in zip(dense, engine_lp))
        assert gap_sparse < 1e-5, (case, gap_sparse)
        assert gap_dense > 1e-3, (case, gap_dense)  # the test can fail: dense is not the sampler
    for impl, logp in flex.items():  # FlexAttention over the pack's tiles
        gap = max((a - b).abs().max().item() for a, b in zip(logp, cases[0][1]))
        assert gap < 1e-5, (impl, gap)


def test_sparse_recompute_under_tensor_parallelism(tiny_model_factory, tmp_path):
    """TP = 2 splits the KV heads over the ranks: each rank replays its own heads' evictions."""
    hf = tiny_model_factory("qwen2.5")  # 2 KV heads: one per rank
    cases = [engine_samples(hf, *c) for c in (CASES[0], CASES[2])]
    ranks = cpu_megatron.run_on_ranks((__file__, "replay_task"), 2, str(hf), str(tmp_path / "c"),
                                      [s for s, _ in cases], 2)
    for results, _ in ranks:  # both TP ranks hold the full log-probs
        for (_, engine_lp), (sparse, _) in zip(cases, results):
            assert max((a - b).abs().max().item() for a, b in zip(sparse, engine_lp)) < 1e-5
