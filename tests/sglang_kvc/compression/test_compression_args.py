"""--compress-* flags: reference names, defaults, and startup failures that name the flag."""

from __future__ import annotations

import argparse

import pytest

from sglang_kvc.compression import CompressionConfig
from sglang_kvc.server_args import ServerArgs


def parse(*argv) -> ServerArgs:
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return ServerArgs.from_cli_args(p.parse_args(["--model-path", "m", *argv]))


def test_defaults_are_dense_and_reference_values():
    a = parse()
    assert a.compress_algorithm is None and CompressionConfig.from_server_args(a) is None
    a = parse("--compress-algorithm", "RKV")
    c = CompressionConfig.from_server_args(a)
    assert (c.algorithm, c.budget, c.window, c.divide_method, c.divide_length) == \
        ("rkv", 512, 8, "step_length", 128)
    assert (c.mix_lambda, c.kernel_size, c.pooling, c.sim_threshold) == (0.1, 7, "max", 0.5)
    assert (c.compress_prompt, c.stop_after_think, c.mode) == (False, True, "head")


def test_cli_values_reach_the_config():
    a = parse("--compress-algorithm", "SnapKV", "--compress-max-prompt", "256",
              "--compress-max-window", "16", "--compress-divide-method", "newline",
              "--compress-divide-length", "64", "--compress-kernel-size", "5",
              "--compress-pooling", "avg", "--compress-prompt", "--no-compress-stop-after-think",
              "--compress-shared-selection", "--compress-mix-lambda", "0.07")
    c = CompressionConfig.from_server_args(a)
    assert (c.algorithm, c.budget, c.window, c.divide_method, c.divide_length) == \
        ("snapkv", 256, 16, "newline", 64)
    assert (c.kernel_size, c.pooling, c.compress_prompt, c.stop_after_think, c.mode,
            c.mix_lambda) == (5, "avg", True, False, "shared", 0.07)
    assert parse("--compress-algorithm", "streamingllm", "--compress-selection", "layer"
                 ).compress_selection == "layer"


@pytest.mark.parametrize("kw,flag", [
    (dict(compress_algorithm="h2o"), "--compress-algorithm"),
    (dict(compress_algorithm="rkv", compress_max_prompt=8), "--compress-max-prompt"),
    (dict(compress_max_prompt=0), "--compress-max-prompt"),
    (dict(compress_max_window=0), "--compress-max-window"),
    (dict(compress_divide_length=0), "--compress-divide-length"),
    (dict(compress_divide_method="every"), "--compress-divide-method"),
    (dict(compress_mix_lambda=1.5), "--compress-mix-lambda"),
    (dict(compress_kernel_size=4), "--compress-kernel-size"),
    (dict(compress_kernel_size=0), "--compress-kernel-size"),
    (dict(compress_pooling="mean"), "--compress-pooling"),
    (dict(compress_sim_threshold=2.0), "--compress-sim-threshold"),
    (dict(compress_num_sink=-1), "--compress-num-sink"),
    (dict(compress_algorithm="streamingllm", compress_max_prompt=16, compress_max_window=8,
          compress_num_sink=9), "--compress-num-sink"),
    (dict(compress_selection="token"), "--compress-selection"),
    (dict(compress_max_prompt="512"), "--compress-max-prompt"),
])
def test_bad_values_fail_at_startup_naming_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        ServerArgs(model_path="m", **kw)


@pytest.mark.parametrize("argv,flag", [
    (["--compress-max-prompt", "many"], "--compress-max-prompt"),
    (["--compress-divide-method", "sometimes"], "--compress-divide-method"),
    (["--compress-pooling", "median"], "--compress-pooling"),
])
def test_bad_cli_values_fail_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert flag in capsys.readouterr().err
