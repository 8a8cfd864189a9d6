"""The bucketed transports: flattened buckets (mixed dtypes, unaligned offsets), load_format
"ipc" (shared-memory handles on CPU, CUDA IPC handles on a GPU, in another process), the
flattened-bucket distributed broadcast, /get_weights_by_name, and bad requests as 400s that change
nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import requests
import torch

from sglang_kvc.weights.transport import (bucket_layout, flatten, serialize_ipc_bucket, specs,
                                    unflatten)
from sglang_kvc.weights.loader import iter_safetensors

from ..conftest import free_port


def served(url: str, name: str, like: torch.Tensor) -> torch.Tensor:
    r = requests.post(url + "/get_weights_by_name", json={"name": name, "truncate_size": 1 << 30})
    assert r.status_code == 200, r.text
    return torch.tensor(r.json(), dtype=like.dtype)


def assert_serves(url: str, named) -> None:
    for name, expected in named:
        assert torch.equal(served(url, name, expected), expected.cpu()), name


def _post_ipc(url: str, named, **extra) -> requests.Response:
    payload, keep_alive = serialize_ipc_bucket(named)
    r = requests.post(url + "/update_weights_from_tensor", json={
        "serialized_named_tensors": [payload], "load_format": "ipc", **extra})
    del keep_alive  # answered: the server no longer maps it
    return r


def test_flatten_round_trip_mixed_dtypes_unaligned():
    g = torch.Generator().manual_seed(0)
    named = [("a", torch.randn(3, generator=g).bfloat16()),  # 6 bytes: the next one is unaligned
             ("b", torch.randn(2, 3, generator=g)), ("c", torch.arange(5, dtype=torch.int64)),
             ("d", torch.randn(4, 2, generator=g).t()), ("e", torch.empty(0, 7))]
    flat = flatten(named)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(t.nbytes for _, t in named)
    back = unflatten(flat, bucket_layout(*specs(named)))
    assert [n for n, _ in back] == [n for n, _ in named]
    for (_, t), (_, u) in zip(named, back):
        assert u.dtype == t.dtype and torch.equal(u, t)


@pytest.mark.parametrize("names,dtypes,shapes,message", [
    (["a", "b"], ["float32"], [[1], [1]], "same length"),
    (["a"], ["float99"], [[1]], "unknown dtype"),
    (["a"], ["float32"], [[-1]], "non-negative integers"),
    (["a"], ["float32"], [[True]], "non-negative integers"),
    ([7], ["float32"], [[1]], "must be a string"),
    ("a", ["float32"], [[1]], "must be lists"),
])
def test_bucket_layout_refuses_bad_specs(names, dtypes, shapes, message):
    with pytest.raises(ValueError, match=message):
        bucket_layout(names, dtypes, shapes)


def test_ipc_update_over_http(serve, tiny_models, prompts):
    srv = serve("qwen2.5")
    named = list(iter_safetensors(tiny_models["qwen2.5-seed1"]))
    for part in (named[: len(named) // 2], named[len(named) // 2:]):  # two buckets
        r = _post_ipc(srv.url, part, weight_version="ipc-1")
        assert r.status_code == 200 and r.json()["success"], r.text
    assert_serves(srv.url, named)
    assert srv.engine.weight_version == "ipc-1"


BAD = {  # request fields -> what the 400 says
    "not JSON": (lambda b: {"serialized_named_tensors": ["{nope"]}, "not JSON"),
    "a list": (lambda b: {"serialized_named_tensors": ["[]"]}, "must be an object"),
    "no strings": (lambda b: {"serialized_named_tensors": [5]}, "non-empty list of strings"),
    "handle kind": (lambda b: dict(b, handle=dict(b["handle"], kind="tcp")), "cpu_shm or cuda"),
    "any file": (lambda b: dict(b, handle=dict(b["handle"], filename="/etc/passwd")),
                 "not a torch shared-memory name"),
    "gone": (lambda b: dict(b, handle=dict(b["handle"], filename="/torch_1_2_3")),
             "cannot open the cpu_shm IPC buffer"),
    "growing": (lambda b: dict(b, handle=dict(b["handle"], nbytes=1 << 30)), "bytes of tensor data"),
    "other GPU": (lambda b: dict(b, handle={"kind": "cuda", "device_uuid": "GPU-none"}),
                  "sees no GPU"),
    "lengths": (lambda b: dict(b, names=b["names"] + ["x"]), "same length"),
    "dtype": (lambda b: dict(b, dtypes=["float99"]), "unknown dtype"),
    "shape": (lambda b: dict(b, shapes=[[3]]), "shape mismatch"),
    "name": (lambda b: dict(b, names=["model.nothing.weight"]), "unexpected weight name"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_ipc_request_is_400_and_changes_nothing(serve, tiny_models, prompts, case):
    srv = serve("qwen2.5")
    norm = [("model.norm.weight", torch.full((64,), 3.0))]
    body, message = BAD[case]
    payload, keep_alive = serialize_ipc_bucket(norm)
    made = body(json.loads(payload))
    request = made if "serialized_named_tensors" in made else {
        "serialized_named_tensors": [json.dumps(made)]}
    r = requests.post(srv.url + "/update_weights_from_tensor", json={**request, "load_format": "ipc"})
    assert r.status_code == 400 and message in r.json()["message"], r.text
    assert not torch.equal(served(srv.url, *norm[0]), norm[0][1])
    gen = requests.post(srv.url + "/generate", json={"text": prompts[0], "sampling_params": {
        "max_new_tokens": 2}})
    assert gen.status_code == 200, gen.text


def test_unknown_load_format_and_weight_names_are_400(serve):
    srv = serve("qwen2.5")
    r = requests.post(srv.url + "/update_weights_from_tensor",
                      json={"serialized_named_tensors": ["x"], "load_format": "pickle"})
    assert r.status_code == 400 and "load_format 'pickle' not supported" in r.json()["message"]
    for body, message in [({"name": "model.nothing"}, "unexpected weight name"),
                          ({"name": "lm_head.weight"}, "not stored"),  # tied to the embedding
                          ({"name": "model.norm.weight", "truncate_size": 0}, "positive integer"),
                          ({}, "missing field(s): name")]:
        r = requests.post(srv.url + "/get_weights_by_name", json=body)
        assert r.status_code == 400 and message in r.text, r.text


TRAINER = textwrap.dedent("""
    import os, sys
    from sglang_kvc.weights.transport import create_weight_update_group, flatten
    from sglang_kvc.weights.loader import iter_safetensors
    port, ckpt = int(sys.argv[1]), sys.argv[2]
    group = create_weight_update_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo",
                                       group_name="flat")
    group.broadcast(flatten(list(iter_safetensors(ckpt))), src=0)  # the whole model at once
    print("sent", flush=True)
    os._exit(0)  # no gloo destructors while the peer may still hold the connection
""")


def test_flattened_bucket_distributed(serve, tiny_models):
    srv = serve("qwen2.5")
    ckpt = str(tiny_models["qwen2.5-seed1"])
    named = list(iter_safetensors(ckpt))
    port = free_port()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(port), ckpt],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = requests.post(srv.url + "/init_weights_update_group", timeout=120, json={
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": "flat", "backend": "gloo"})
        assert r.status_code == 200, r.text
        names, dtypes, shapes = specs(named)
        r = requests.post(srv.url + "/update_weights_from_distributed", timeout=120, json={
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": "flat",
            "load_format": "flattened_bucket", "weight_version": "flat-1"})
        assert r.status_code == 200 and r.json()["success"], r.text
        out, err = trainer.communicate(timeout=60)
        assert trainer.returncode == 0 and "sent" in out, err
    finally:
        if trainer.poll() is None:
            trainer.kill()
    requests.post(srv.url + "/destroy_weights_update_group", json={"group_name": "flat"})
    assert_serves(srv.url, named)
    assert srv.engine.weight_version == "flat-1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ipc_into_a_server_process(tiny_models, wait_healthy):
    """Another process on this GPU maps the trainer's CUDA buffer and copies from it; the
    buffer's memory comes back to the sender once the server has answered."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                               str(tiny_models["qwen2.5"]), "--port", str(port), "--device",
                               "cuda", "--max-total-tokens", "4096", "--log-level", "warning"],
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        named = [(n, t.cuda()) for n, t in iter_safetensors(tiny_models["qwen2.5-seed1"])]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        r = _post_ipc(url, named, weight_version="cuda-ipc")
        assert r.status_code == 200 and r.json()["success"], r.text
        torch.cuda.ipc_collect()
        assert torch.cuda.memory_allocated() == base
        assert_serves(url, named)
    finally:
        server.terminate()
        server.wait(timeout=60)
