"""HF -> Megatron torch_dist -> HF is bit-exact for every fixture family and dtype."""

import json

import pytest
import torch

from checkpoint_tools.hf2megatron import convert_hf_to_torch_dist
from checkpoint_tools.megatron2hf import convert_torch_dist_to_hf
from checkpoint_tools.tiny_models import FAMILIES
from checkpoint_tools.torch_dist import read_common, read_tracker, tensor_metadata


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_roundtrip_is_bit_exact(family, tiny_model_factory, tmp_path, same_weights):
    hf = tiny_model_factory(family)
    ckpt = convert_hf_to_torch_dist(hf, tmp_path / "mcore")
    assert read_tracker(tmp_path / "mcore") == "release" and ckpt.name == "release"
    for name in ("metadata.json", "common.pt", ".metadata"):
        assert (ckpt / name).is_file(), name
    assert list(ckpt.glob("__0_*.distcp"))
    out = convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf", origin_hf_dir=hf,
                                   progress=False)
    same_weights(hf, out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (hf / name).read_bytes(), name
    original, exported = json.loads((hf / "config.json").read_text()), json.loads(
        (out / "config.json").read_text())
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size",
                "tie_word_embeddings", "num_key_value_heads"):
        assert exported[key] == original[key], key


def test_checkpoint_uses_megatron_names_stacked_layers_and_padded_vocab(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen3")
    ckpt = convert_hf_to_torch_dist(hf, tmp_path / "mcore", tp=2)
    meta = tensor_metadata(ckpt)
    cfg = json.loads((hf / "config.json").read_text())
    layers, hidden, head_dim = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]
    q_rows = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * head_dim
    assert meta["embedding.word_embeddings.weight"][0] == (512, hidden)  # 448 -> multiple of 256
    assert meta["decoder.layers.self_attention.linear_qkv.weight"][0] == (layers, q_rows, hidden)
    assert meta["decoder.layers.self_attention.q_layernorm.weight"][0] == (layers, head_dim)
    assert meta["decoder.layers.mlp.linear_fc1.weight"][0] == (
        layers, 2 * cfg["intermediate_size"], hidden)
    assert "output_layer.weight" not in meta  # tied
    args = read_common(ckpt)["args"]
    assert (args.num_layers, args.kv_channels, args.qk_layernorm, args.padded_vocab_size) == (
        layers, head_dim, True, 512)
    assert args.untie_embeddings_and_output_weights is False


@pytest.mark.parametrize("family", ["qwen2.5", "llama3"])
def test_bf16_roundtrip_without_origin_dir_and_sharded_output(family, tiny_model_factory, tmp_path,
                                                             hf_tensors, same_weights):
    hf = tiny_model_factory(family, dtype=torch.bfloat16, max_shard_size="60KB")
    assert (hf / "model.safetensors.index.json").is_file()  # sharded input is read too
    convert_hf_to_torch_dist(hf, tmp_path / "mcore", iteration=7)
    assert read_tracker(tmp_path / "mcore") == "7"
    assert (tmp_path / "mcore" / "iter_0000007" / "metadata.json").is_file()
    # config from common.pt; small shards force model-0000k-of-0000n files with an index
    out = convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf", max_shard_bytes=50_000,
                                   progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert {p.name for p in out.glob("*.safetensors")} == set(files)
    assert set(index["weight_map"]) == set(hf_tensors(out))
    same_weights(hf, out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_vocab_size_flag_trims_padding(tiny_model_factory, tmp_path, hf_tensors):
    hf = tiny_model_factory("qwen2.5")
    convert_hf_to_torch_dist(hf, tmp_path / "mcore")
    out = convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf", vocab_size=400,
                                   progress=False)
    original, exported = hf_tensors(hf), hf_tensors(out)
    assert exported["model.embed_tokens.weight"].shape[0] == 400
    assert torch.equal(exported["model.embed_tokens.weight"], original["model.embed_tokens.weight"][:400])
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 400
