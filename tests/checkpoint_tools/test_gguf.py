"""GGUF import: clear errors for missing files, foreign architectures and tensor types (GGUFs
written here with the gguf package), and on the real SmolLM2 checkpoint a plain HF model that
round-trips through torch_dist bit-exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
gguf = pytest.importorskip("gguf")


def _gguf2hf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "checkpoint_tools.gguf2hf", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _write_gguf(path: Path, arch: str, raw_dtype=None) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    if raw_dtype is None:
        writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    else:  # one block of raw bytes of the given type
        _, nbytes = gguf.GGML_QUANT_SIZES[raw_dtype]
        writer.add_tensor("token_embd.weight", np.zeros(nbytes, dtype=np.uint8),
                          raw_shape=(nbytes,), raw_dtype=raw_dtype)  # byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("case,message", [
    ("missing", "file not found"),
    ("not_gguf", "not a readable GGUF file"),
    ("gpt2", "architecture 'gpt2' is not supported"),
    ("iq2", "tensor type(s) IQ2_XXS cannot be dequantized"),
])
def test_bad_input_is_a_clear_error(tmp_path, case, message):
    path = tmp_path / "model.gguf"
    if case == "not_gguf":
        path.write_bytes(b"definitely not gguf" * 10)
    elif case == "gpt2":
        _write_gguf(path, "gpt2")
    elif case == "iq2":
        _write_gguf(path, "llama", raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    proc = _gguf2hf("--gguf", str(path), "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_is_a_plain_hf_checkpoint_that_round_trips(smollm2, tmp_path, same_weights):
    from checkpoint_tools.hf2megatron import convert_hf_to_torch_dist
    from checkpoint_tools.megatron2hf import convert_torch_dist_to_hf

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert config["tie_word_embeddings"] and config["dtype"] == "bfloat16"
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()
    convert_hf_to_torch_dist(smollm2, tmp_path / "mcore")
    out = convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf", origin_hf_dir=smollm2,
                                   progress=False)
    same_weights(smollm2, out)
