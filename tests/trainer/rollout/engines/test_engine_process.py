"""--rollout-engine-process's pieces: the launch_server command line for the run's engine flags."""

import argparse

import pytest

from sglang_kvc.server_args import ServerArgs
from trainer.rollout.engines.processes import server_argv


def _parsed(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "m", *argv]))


@pytest.mark.parametrize("values", [
    {},
    {"device": "cuda:1", "max_total_tokens": 20480, "mem_fraction_static": 0.3},
    {"compress_algorithm": "rkv", "compress_max_prompt": 128, "compress_prompt": True,
     "cuda_graph": False, "dtype": "bfloat16", "compress_selection": "layer"},
])
def test_server_argv_round_trips_through_launch_servers_parser(values):
    """What the child process parses is the ServerArgs the in-process engine would get."""
    args = ServerArgs(model_path="m", **values)
    argv = server_argv(args)
    assert _parsed(argv) == args
    assert "--model-path" not in argv and "--port" not in argv  # the fleet sets those
    assert len(argv) >= len(values)
