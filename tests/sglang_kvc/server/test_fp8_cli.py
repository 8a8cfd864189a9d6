"""launch_server's FP8 KV flags fail in one line naming the flag."""

from __future__ import annotations

from tests.sglang_kvc.server.test_cli_errors import _fails_in_one_line


def test_unknown_kv_dtype(tiny_models):
    _fails_in_one_line(["--model-path", str(tiny_models["llama3"]), "--kv-cache-dtype", "fp8"],
                       "--kv-cache-dtype")


def test_bad_scales_file(tiny_models, tmp_path):
    bad = tmp_path / "scales.json"
    bad.write_text("{}")
    line = _fails_in_one_line(["--model-path", str(tiny_models["llama3"]), "--device", "cpu",
                               "--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", str(bad)],
                              "--quantization-param-path")
    assert line.startswith("python -m sglang_kvc.launch_server: error: --quantization-param-path")
