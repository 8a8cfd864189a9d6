"""Shared fixtures: tiny checkpoints (built once per session) and an in-thread HTTP server."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from checkpoint_tools.tiny_models import FAMILIES, make_tiny_model

PROMPTS = [
    "The answer is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many",
    "1 2 3",
    "Let's think step by step and output the final answer within \\boxed{}.",
]


@pytest.fixture(scope="session", autouse=True)
def check_kv_ownership():
    """Every engine these tests build checks the KV ownership invariant after each step and
    command (kvcache/ownership.py): a double free or leak fails the test that caused it.
    SGLANG_KVC_CHECK_KV=0 in the environment turns it off (to time the suite without it)."""
    from sglang_kvc.kvcache.ownership import ENV

    before = os.environ.get(ENV)
    os.environ.setdefault(ENV, "1")
    yield
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return list(PROMPTS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict:
    """family -> checkpoint dir, plus 'qwen2.5-seed1' (same shapes, other weights) and
    'qwen2.5-sharded' (same weights as qwen2.5, several safetensors files)."""
    root = tmp_path_factory.mktemp("tiny")
    paths = {fam: make_tiny_model(fam, root / fam) for fam in FAMILIES}
    paths["qwen2.5-seed1"] = make_tiny_model("qwen2.5", root / "qwen2.5-seed1", seed=1)
    paths["qwen2.5-sharded"] = make_tiny_model("qwen2.5", root / "qwen2.5-sharded", max_shard_size="50KB")
    return paths


@pytest.fixture(scope="session")
def hf_reference():
    """Cached HF greedy generation: (path, prompt ids, n) -> new token ids (no EOS stop)."""
    from transformers import AutoModelForCausalLM

    models, cache = {}, {}

    def generate(path, ids: list[int], n: int) -> list[int]:
        key = (str(path), tuple(ids), n)
        if key not in cache:
            if str(path) not in models:
                models[str(path)] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            x = torch.tensor([ids])
            out = models[str(path)].generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                             do_sample=False, eos_token_id=None, pad_token_id=0)
            cache[key] = out[0, len(ids):].tolist()
        return cache[key]

    def model(path):
        if str(path) not in models:
            models[str(path)] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return models[str(path)]

    generate.model = model
    return generate


@pytest.fixture(scope="module")
def serve(tiny_models):
    """Factory: an Engine on a tiny checkpoint behind uvicorn in a thread; stopped after the module.
    Returns the ServerThread (with .url and .engine)."""
    from sglang_kvc.engine.engine import Engine
    from sglang_kvc.server.app import ServerThread

    started = []

    def start(name: str = "qwen2.5", **kw):
        eng = Engine(model_path=str(tiny_models[name]), device="cpu", **kw)
        srv = ServerThread(eng, port=free_port())
        srv.engine = eng
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()
        srv.engine.shutdown()
