"""An engine on the second GPU while the caller's current device is the first (rank 1 of a
torchrun job, or any thread that never set its device): every step runs on its own device, with
and without CUDA graphs and R-KV, and gives the first GPU's tokens. Skipped below two GPUs."""

from __future__ import annotations

import threading

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

RKV = {"compress_algorithm": "rkv", "compress_max_prompt": 12, "compress_divide_length": 4,
       "compress_max_window": 3}
PARAMS = {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True, "sampling_seed": 5}


def _generate(model, device: str, prompts, **extra):
    from sglang_kvc.engine.engine import Engine

    with Engine(model_path=str(model), device=device, dtype="float32", **extra) as eng:
        outs = eng.generate(prompt=prompts, sampling_params=PARAMS, return_logprob=True)
    return [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in outs]


@pytest.mark.parametrize("cuda_graph", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("extra", [{}, RKV], ids=["dense", "rkv"])
def test_engine_on_cuda1_matches_cuda0(tiny_models, prompts, cuda_graph, extra):
    torch.cuda.set_device(0)
    first = _generate(tiny_models["qwen3"], "cuda:0", prompts, cuda_graph=cuda_graph, **extra)
    second = _generate(tiny_models["qwen3"], "cuda:1", prompts, cuda_graph=cuda_graph, **extra)
    assert all(reason == "length" for _, reason in second)  # none failed (an abort before)
    assert second == first


def test_engine_built_and_driven_from_threads_on_device0(tiny_models, prompts):
    """Built in one fresh thread, generating from another: neither ever set a device."""
    box = {}
    builder = threading.Thread(target=lambda: box.update(out=_generate(
        tiny_models["qwen3"], "cuda:1", prompts, **RKV)))
    builder.start()
    builder.join()
    assert box["out"] == _generate(tiny_models["qwen3"], "cuda:0", prompts, **RKV)
