"""Weight updates over HTTP (disk, tensor, distributed via gloo with a second process) give the
outputs of a fresh server on the new weights; weight_version follows."""

from __future__ import annotations

import concurrent.futures
import socket
import subprocess
import sys
import textwrap

import requests

from sglang_kvc.weights.transport import serialize_named_tensors
from sglang_kvc.weights.loader import iter_safetensors

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outputs(url, prompts):
    r = requests.post(url + "/generate", json={"text": prompts, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return [o["output_ids"] for o in r.json()]


def _fresh(tiny_models, hf_reference, tokenizer, prompts):
    return [hf_reference(tiny_models["qwen2.5-seed1"], tokenizer.encode(p), GREEDY["max_new_tokens"])
            for p in prompts]


def test_update_from_disk(serve, tiny_models, hf_reference, prompts):
    srv = serve("qwen2.5")
    old = _outputs(srv.url, prompts)
    r = requests.post(srv.url + "/update_weights_from_disk",
                      json={"model_path": str(tiny_models["qwen2.5-seed1"]), "weight_version": "v2"})
    assert r.status_code == 200 and r.json()["success"], r.text
    new = _outputs(srv.url, prompts)
    assert new == _fresh(tiny_models, hf_reference, srv.engine.tokenizer, prompts) != old
    assert requests.get(srv.url + "/get_weight_version").json()["weight_version"] == "v2"
    meta = requests.post(srv.url + "/generate", json={"text": "x", "sampling_params": GREEDY}).json()["meta_info"]
    assert meta["weight_version"] == "v2"
    bad = requests.post(srv.url + "/update_weights_from_disk", json={"model_path": "/nonexistent"})
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert _outputs(srv.url, prompts) == new


def test_update_from_tensor(serve, tiny_models, hf_reference, prompts):
    srv = serve("qwen2.5")
    named = list(iter_safetensors(tiny_models["qwen2.5-seed1"]))
    # two requests, half the tensors each, as a trainer sending buckets would
    for part in (named[: len(named) // 2], named[len(named) // 2:]):
        r = requests.post(srv.url + "/update_weights_from_tensor", json={
            "serialized_named_tensors": [serialize_named_tensors(part)], "weight_version": "t1"})
        assert r.status_code == 200 and r.json()["success"], r.text
    assert _outputs(srv.url, prompts) == _fresh(tiny_models, hf_reference, srv.engine.tokenizer, prompts)
    bad = requests.post(srv.url + "/update_weights_from_tensor",
                        json={"serialized_named_tensors": ["not base64!"]})
    assert bad.status_code == 400
    wrong = serialize_named_tensors([("model.norm.weight", named[0][1][:3])])
    r = requests.post(srv.url + "/update_weights_from_tensor", json={"serialized_named_tensors": [wrong]})
    assert r.status_code == 400 and "shape" in r.json()["message"]


TRAINER = textwrap.dedent("""
    import os
    import sys
    from sglang_kvc.weights.transport import create_weight_update_group
    from sglang_kvc.weights.loader import iter_safetensors
    port, ckpt = int(sys.argv[1]), sys.argv[2]
    group = create_weight_update_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo")
    for name, tensor in iter_safetensors(ckpt):
        group.broadcast(tensor.contiguous(), src=0)
    print("sent", flush=True)
    # Leave without running gloo's destructors while the peer may still hold the connection.
    os._exit(0)
""")


def test_update_from_distributed(serve, tiny_models, hf_reference, prompts):
    srv = serve("qwen2.5")
    ckpt = str(tiny_models["qwen2.5-seed1"])
    port = _free_port()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(port), ckpt],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        named = list(iter_safetensors(ckpt))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            r = requests.post(srv.url + "/init_weights_update_group", timeout=120, json={
                "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                "world_size": 2, "group_name": "weight_update_group", "backend": "gloo"})
            assert r.status_code == 200 and r.json()["success"], r.text
            fut = pool.submit(requests.post, srv.url + "/update_weights_from_distributed", timeout=120, json={
                "names": [n for n, _ in named], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
                "shapes": [list(t.shape) for _, t in named], "group_name": "weight_update_group",
                "weight_version": "d1"})
            r = fut.result(timeout=120)
        assert r.status_code == 200 and r.json()["success"], r.text
        out, err = trainer.communicate(timeout=60)
        assert trainer.returncode == 0 and "sent" in out, err
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert requests.post(srv.url + "/destroy_weights_update_group",
                         json={"group_name": "weight_update_group"}).json()["success"]
    assert _outputs(srv.url, prompts) == _fresh(tiny_models, hf_reference, srv.engine.tokenizer, prompts)
    assert srv.engine.weight_version == "d1"


def test_in_process_weight_update(tiny_models, hf_reference, prompts):
    from sglang_kvc.engine.engine import Engine

    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu") as eng:
        eng.update_weights_from_tensor(named_tensors=iter_safetensors(tiny_models["qwen2.5-seed1"]))
        outs = eng.generate(prompt=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == _fresh(tiny_models, hf_reference, eng.tokenizer, prompts)
        eng.release_memory()
        eng.resume_memory()
        assert [o["output_ids"] for o in eng.generate(prompt=prompts, sampling_params=GREEDY)] == \
            [o["output_ids"] for o in outs]
