"""CUDA path: the bf16 engine (skipped without a GPU); the decode kernel: test_triton_decode.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_cuda_fp32_engine_matches_cpu(tiny_models, prompts, cuda_graph):
    from sglang_kvc.engine.engine import Engine

    params = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    outs = {}
    for device in ("cpu", "cuda"):
        with Engine(model_path=str(tiny_models["qwen3"]), device=device, dtype="float32",
                    cuda_graph=cuda_graph) as eng:
            outs[device] = eng.generate(prompt=prompts, sampling_params=params, return_logprob=True)
    for c, g in zip(outs["cpu"], outs["cuda"]):
        assert c["output_ids"] == g["output_ids"]
        for (a, _, _), (b, _, _) in zip(c["meta_info"]["output_token_logprobs"],
                                        g["meta_info"]["output_token_logprobs"]):
            assert abs(a - b) < 1e-3


def test_cuda_bf16_logprobs_close_to_hf(tiny_models, prompts):
    from transformers import AutoModelForCausalLM

    from sglang_kvc.engine.engine import Engine

    path = str(tiny_models["llama3"])
    with Engine(model_path=path, device="cuda", dtype="bfloat16") as eng:
        outs = eng.generate(prompt=prompts, sampling_params={"temperature": 1.0, "max_new_tokens": 32,
                                                             "ignore_eos": True, "sampling_seed": 3},
                            return_logprob=True)
        tok = eng.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    for p, o in zip(prompts, outs):
        ids = tok.encode(p)
        x = torch.tensor([ids + o["output_ids"]], device="cuda")
        with torch.no_grad():
            lp = torch.log_softmax(hf(x).logits[0].float(), dim=-1)
        ref = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(o["output_ids"])]
        got = [e[0] for e in o["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ref, got)) < 0.1


@pytest.mark.parametrize("extra", [{}, {"compress_algorithm": "rkv", "compress_max_prompt": 12,
                                        "compress_divide_length": 4, "compress_max_window": 3}],
                         ids=["dense", "rkv"])
def test_graphed_steps_match_eager_and_cpu(tiny_models, extra):
    """Whole decode steps replayed as CUDA graphs (forward, seeded sampling with and without
    filters, logprobs, top logprobs, stop ids, min_new_tokens bans, requests ending at different
    steps, overlap on) give the eager CUDA engine's and the CPU engine's tokens; fp32, so the
    only differences are summation orders."""
    from sglang_kvc.engine.engine import Engine

    from .test_overlap import assert_same, request_mix, run_mix

    outs, mix = {}, None
    for name, kw in (("cpu", dict(device="cpu")), ("eager", dict(device="cuda", cuda_graph=False)),
                     ("graph", dict(device="cuda", cuda_graph=True))):
        with Engine(model_path=str(tiny_models["qwen2.5"]), dtype="float32", **kw, **extra) as eng:
            mix = mix or request_mix(eng)  # built once, on the CPU engine's tokenizer
            outs[name] = run_mix(eng, mix)
            if name == "graph":
                assert eng.runner.graphs.graphs  # the graphed path really ran
    assert_same(outs["graph"], outs["eager"], tol=1e-3)
    assert_same(outs["graph"], outs["cpu"], tol=1e-3)


@pytest.mark.parametrize("move_pool", [False, True])
def test_graphs_survive_a_kv_release_or_are_recaptured(tiny_models, prompts, move_pool):
    """The trainer releases the KV pool around every training phase. The decode graphs are kept
    when the pool comes back at the same addresses and re-captured when it moved (a tensor taking
    its old place forces that); either way the tokens and log-probs equal a fresh engine's."""
    from sglang_kvc.engine.engine import Engine

    params = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": 5}
    path = str(tiny_models["qwen2.5"])
    with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=2048,
                kv_stable_address=False) as eng:  # the caching allocator's pool (the stable one: below)
        first = eng.generate(prompt=prompts, sampling_params=params, return_logprob=True)
        captures = eng.get_server_info()["cuda_graphs"]["captures"]
        ptrs = eng.runner.graphs.kv_ptrs
        eng.release_memory(["kv_cache"])
        squatter = torch.empty(eng.kv.pool.bytes, dtype=torch.uint8, device="cuda") if move_pool else None
        eng.resume_memory(["kv_cache"])
        again = eng.generate(prompt=prompts, sampling_params=params, return_logprob=True)
        info = eng.get_server_info()["cuda_graphs"]
        now = (eng.kv.pool.k.data_ptr(), eng.kv.pool.v.data_ptr())
        del squatter
    for a, b in zip(first, again):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
    # re-captured exactly when the pool moved (the old graphs would write the old addresses)
    assert (info["captures"] > captures) == (now != ptrs)


def test_stable_pool_keeps_graphs_across_a_colocated_release(tiny_models, prompts):
    """The colocated trainer's cycle with the stable pool (the default): the release gives the
    pool's memory back to the driver (another allocation can take it), the resume brings the pool
    back at the same address, so no graph is captured again; tokens and log-probs equal the
    first rollout's (same seed)."""
    from sglang_kvc.engine.engine import Engine

    params = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": 5}
    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cuda", dtype="float32",
                max_total_tokens=1 << 16) as eng:
        assert eng.kv.pool.stable is not None
        first = eng.generate(prompt=prompts, sampling_params=params, return_logprob=True)
        captures = eng.get_server_info()["cuda_graphs"]["captures"]
        ptrs, size = eng.runner.graphs.kv_ptrs, eng.kv.pool.bytes
        free_before = torch.cuda.mem_get_info()[0]
        eng.release_memory(["kv_cache"])
        freed = torch.cuda.mem_get_info()[0] - free_before
        squatter = torch.empty(size, dtype=torch.uint8, device="cuda")  # the trainer's update
        squatter.fill_(7)
        eng.resume_memory(["kv_cache"])
        again = eng.generate(prompt=prompts, sampling_params=params, return_logprob=True)
        info = eng.get_server_info()["cuda_graphs"]
        now = (eng.kv.pool.k.data_ptr(), eng.kv.pool.v.data_ptr())
        assert int(squatter.min()) == int(squatter.max()) == 7  # the pool did not write into it
        del squatter
    assert freed >= size * 0.9, (freed, size)
    assert now == ptrs and info["captures"] == captures
    for a, b in zip(first, again):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]


def test_graphs_captured_while_another_thread_computes(tiny_models, prompts):
    """Async training (--max-staleness) captures decode graphs on the rollout thread while the
    trainer's thread launches kernels, allocates and synchronizes the device. Unguarded, the
    trainer's torch.cuda.synchronize() fails during a capture and invalidates it (H200,
    2026-11-25); with the trainer holding CAPTURE_GATE around its GPU work, captures wait for the
    gaps (steps meanwhile run eagerly), neither thread fails and the tokens equal a quiet run's."""
    import threading
    import time

    from sglang_kvc.engine.cuda_graph import CAPTURE_GATE
    from sglang_kvc.engine.engine import Engine

    params = {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 5}
    path = str(tiny_models["qwen2.5"])

    def generate():
        with Engine(model_path=path, device="cuda", dtype="float32", cuda_graph=True) as eng:
            outs = [o["output_ids"] for o in eng.generate(prompt=prompts, sampling_params=params)]
            return outs, eng.get_server_info()["cuda_graphs"]

    quiet, _ = generate()
    stop, errors = threading.Event(), []

    def trainer_thread():
        try:
            x = torch.randn(512, 512, device="cuda")
            while not stop.is_set():
                with CAPTURE_GATE.device_work():
                    x = torch.tanh(x @ x.T / 512) + torch.empty(4096, device="cuda").sum()  # allocates
                    torch.cuda.synchronize()
                time.sleep(0.002)  # a trainer between its phases: the gaps captures fit in
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(e)

    worker = threading.Thread(target=trainer_thread)
    worker.start()
    try:
        busy, graphs = generate()
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert busy == quiet
    assert graphs["captures"] >= 1, graphs  # the gaps were used: not every step ran eagerly
