"""Sessions on CUDA (skipped without a GPU): a compressed and a dense session, decode steps as
CUDA graphs with overlap, give the CPU engine's tokens turn by turn (fp32: only summation
orders differ), and close_session returns the pool."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

RKV = {"compress_algorithm": "rkv", "compress_max_prompt": 12, "compress_divide_length": 4,
       "compress_max_window": 3}


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def turns_on(device, tiny_models, extra):
    from sglang_kvc.engine.engine import Engine

    turns = [[tokens(21, seed=1)] * 2, [tokens(9, seed=2), tokens(14, seed=3)], [tokens(5, seed=4)] * 2]
    with Engine(model_path=str(tiny_models["qwen2.5"]), device=device, dtype="float32", **extra) as eng:
        base = eng.get_server_info()["kv_pool"]["used"]
        sids = [eng.open_session() for _ in range(2)]
        prev, outs = [None, None], []
        for ids in turns:
            out = eng.generate(input_ids=ids, return_logprob=True,
                               sampling_params={"temperature": 0.0, "max_new_tokens": 20,
                                                "ignore_eos": True},
                               session_params=[{"id": s, "rid": r} for s, r in zip(sids, prev)])
            prev = [o["meta_info"]["id"] for o in out]
            outs += out
        for s in sids:
            eng.close_session(s)
        assert eng.get_server_info()["kv_pool"]["used"] == base
    return outs


@pytest.mark.parametrize("extra", [{}, RKV], ids=["dense", "rkv"])
def test_cuda_sessions_match_cpu(tiny_models, extra):
    cpu, gpu = turns_on("cpu", tiny_models, extra), turns_on("cuda", tiny_models, extra)
    for c, g in zip(cpu, gpu):
        assert c["output_ids"] == g["output_ids"]
        a = torch.tensor([x[0] for x in c["meta_info"]["output_token_logprobs"]])
        b = torch.tensor([x[0] for x in g["meta_info"]["output_token_logprobs"]])
        assert (a - b).abs().max() < 1e-3
