"""The rollout side's flags, read by ``rollout/config.py``: what the loop gets from them."""

from __future__ import annotations

import pytest

from trainer.arguments import build_parser, parse_args
from trainer.rollout.config import rollout_setup_from_args
from trainer.rollout.engines.weight_sync import MODES


@pytest.fixture
def flags(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # all check_args asks of --hf-checkpoint
    return ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path)]


def test_weight_sync_choices_are_the_transports():
    action = next(a for a in build_parser()._actions if a.dest == "weight_sync")
    assert action.choices == ["auto", *MODES]


def test_rollout_seeds_depend_on_seed_and_rollout_only(flags):
    plan = rollout_setup_from_args(parse_args([*flags, "--seed", "7"])).plan
    assert plan.sampling_for(3) == plan.sampling_for(3)
    assert plan.sampling_for(3).seed != plan.sampling_for(4).seed
    assert plan.sampling.seed is None  # the flag's config stays unseeded


def test_eval_sets_and_keys(flags, tmp_path):
    a, b = (tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    for path in (a, b):
        path.write_text('{"prompt": "p", "label": "1"}\n')  # checked when the flags are parsed
    data = rollout_setup_from_args(parse_args(
        [*flags, "--input-key", "q", "--eval-prompt-data", "a", str(a), "b", str(b),
         "--eval-label-key", "gold"])).data
    assert data.eval_data == [("a", str(a)), ("b", str(b))]
    assert (data.eval_input_key, data.eval_label_key) == ("q", "gold")


def test_engine_flags_become_server_args(flags):
    args = parse_args([*flags, "--sglang-compress-algorithm", "rkv"])
    engines = rollout_setup_from_args(args).engines
    assert not engines.remote
    server_args = engines.server_args(device="cpu")
    assert (server_args.compress_algorithm, server_args.device) == ("rkv", "cpu")
    assert server_args.model_path == flags[1]


@pytest.mark.parametrize("extra,want", [([], 0), (["--env-path", "recipes.tool_use:ArithToolEnv"], 16),
                                        (["--env-path", "recipes.tool_use:ArithToolEnv",
                                          "--sglang-schedule-prefill-delay-steps", "0"], 0),
                                        (["--sglang-schedule-prefill-delay-steps", "4"], 4)])
def test_prefill_delay_defaults_to_16_for_multiturn_runs(flags, extra, want):
    """Multi-turn runs batch arriving turns (engine --schedule-prefill-delay-steps 16) unless
    the flag says otherwise; single-turn runs keep the engine's 0."""
    engines = rollout_setup_from_args(parse_args([*flags, *extra])).engines
    assert engines.server_args(device="cpu").schedule_prefill_delay_steps == want


def test_weight_updates_skip_the_router(flags):
    remote = [*flags, "--rollout-server-urls", "http://router", "--weight-sync", "disk"]
    engines = rollout_setup_from_args(parse_args(remote)).engines
    backend = object()
    assert engines.weights_door(backend) is backend
    behind = rollout_setup_from_args(parse_args([*remote, "--rollout-engine-urls", "http://e0"]))
    assert behind.engines.weights_door(backend).urls == ["http://e0"]
    assert behind.engines.weights_door(None) is None  # a rank that talks to no engine
    colocated = rollout_setup_from_args(parse_args(flags)).engines
    assert colocated.weights_door(backend) is backend


def test_eval_passes_per_temperature_and_compression(flags):
    """'--eval-temperature 0 1 --eval-compression both': four passes; greedy draws one sample per
    prompt, T = 1 draws --n-samples-per-eval-prompt; the dense passes ask for no compression."""
    plan = rollout_setup_from_args(parse_args(
        [*flags, "--eval-temperature", "0", "1", "--n-samples-per-eval-prompt", "4",
         "--eval-compression", "both"])).plan
    passes = [(suffix, s.temperature, s.compress, n) for suffix, s, n in plan.eval_configs()]
    assert passes == [("", 0.0, True, 1), ("_dense", 0.0, False, 1),
                      ("_t1", 1.0, True, 4), ("_t1_dense", 1.0, False, 4)]


def test_one_eval_temperature_keeps_its_names(flags):
    plan = rollout_setup_from_args(parse_args(
        [*flags, "--eval-temperature", "0.6", "--n-samples-per-eval-prompt", "3"])).plan
    assert [(suffix, s.temperature, n) for suffix, s, n in plan.eval_configs()] == [("", 0.6, 3)]


def _prompt_file(tmp_path) -> str:
    """--prompt-data must name a file that exists (checked when the flags are parsed)."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "p", "label": "1"}\n')
    return str(path)
