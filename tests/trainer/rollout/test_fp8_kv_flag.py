"""--sglang-kv-cache-dtype fp8_* from the trainer's flags to the engine, and the pool numbers the
trainer reports (metrics, startup line) in FP8 bytes."""

from __future__ import annotations

import argparse

import pytest

from trainer.rollout.engines.capacity import pool_detail
from trainer.rollout.config import add_engine_args, engine_config_from_args


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    p.add_argument("--hf-checkpoint", default="m")
    for flag in ("--rollout-server-urls", "--rollout-engine-urls", "--offload-rollout",
                 "--rollout-engine-process", "--log-dir", "--save"):
        p.add_argument(flag, default=None)
    p.add_argument("--rollout-engine-placement", default="per-gpu")
    p.add_argument("--rollout-num-gpus", type=int, default=0)
    return p


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_flag_reaches_the_engine(dtype):
    args = _parser().parse_args(["--sglang-kv-cache-dtype", dtype])
    assert engine_config_from_args(args).server_args().kv_cache_dtype == dtype


def test_bad_value_is_a_flag_error(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--sglang-kv-cache-dtype", "fp8"])
    assert "--sglang-kv-cache-dtype" in capsys.readouterr().err


def test_pool_numbers_count_fp8_bytes(tiny_model_path):
    """The engine the trainer builds from these flags reports 1 byte per K/V element: the
    metrics' kv_pool_peak_bytes and the startup line use that bytes_per_slot."""
    from sglang_kvc import Engine

    args = _parser().parse_args(["--sglang-kv-cache-dtype", "fp8_e4m3", "--sglang-device", "cpu",
                                 "--sglang-max-total-tokens", "1000",
                                 "--hf-checkpoint", str(tiny_model_path)])
    eng = Engine(server_args=engine_config_from_args(args).server_args())
    try:
        pool = eng.get_server_info()["kv_pool"]
    finally:
        eng.shutdown()
    # qwen2.5 tiny: 2 layers x 2 KV heads x head_dim 16, K and V, 1 byte each
    assert pool["bytes_per_slot"] == 2 * 2 * 2 * 16
    assert pool_detail(pool) == "KV pool of rank 0's engine: 1000 tokens, 0.00 GiB (128 B/token)"


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    from checkpoint_tools.tiny_models import make_tiny_model

    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("tiny") / "qwen2.5")
