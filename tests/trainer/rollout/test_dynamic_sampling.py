"""Dynamic sampling: only groups whose rewards differ are kept, rounds continue until the batch
is full, and every engine's groups are merged in one result."""

from __future__ import annotations

import pytest

from trainer.arguments import parse_args
from trainer.rollout.engines.interface import Generation, RolloutConfig
from trainer.rollout.samples.data import Prompt, PromptStream
from trainer.rollout.dynamic_sampling import DynamicSampler, DynamicSamplingConfig
from trainer.rollout.manager import RolloutResult, Shard
from trainer.rollout.engines.sharding import shard_bounds
from trainer.rollout.samples.traces import sample_traces

# prompt id -> the rewards of its 3 samples: only ids 2, 5, 6 and 9 have any variance
REWARDS = {i: [1.0, 1.0, 1.0] if i % 2 else [0.0, 0.0, 0.0] for i in range(12)}
REWARDS.update({2: [0.0, 1.0, 0.0], 5: [1.0, 0.0, 1.0], 6: [0.0, 0.0, 1.0], 9: [1.0, 1.0, 0.0]})


class FakeManager:
    """Stands in for ``RolloutManager.run``: ``engines`` shards, rewards from REWARDS, and the
    seeds it was asked for."""

    def __init__(self, engines: int):
        self.engines, self.seeds = engines, []

    def run(self, prompts, n, cfg):
        self.seeds.append(cfg.seed)
        shards = []
        for e in range(self.engines):
            start, stop = shard_bounds(len(prompts), self.engines, e)
            local = prompts[start:stop]
            gens = [Generation([1], [0.0], "", "stop", None, {}) for _ in range(len(local) * n)]
            traces = sample_traces([p.input_ids for p in local], gens, n)
            for k, t in enumerate(traces):
                t.reward = REWARDS[local[t.prompt_index].metadata["id"]][k % n]
                t.prompt_index += start
            shards.append(Shard(traces, 1.0, 0.5, faults={"rollout/engine_failures": 1}))
        return RolloutResult(shards)


def _stream():
    prompts = [Prompt(f"p{i}", [i], None, {"id": i}) for i in range(12)]
    return PromptStream(prompts, shuffle=False)


@pytest.mark.parametrize("engines", [1, 2])
def test_keeps_only_groups_with_variance_and_fills_the_batch(engines):
    manager = FakeManager(engines)
    sampler = DynamicSampler(DynamicSamplingConfig("reward_nonzero_std", over_sampling_batch_size=4))
    prompts, result, metrics = sampler.collect(manager, _stream(), 2, 3, RolloutConfig(seed=100))
    # rounds of 4 prompts: [0..3] keeps 2, [4..7] keeps 5 and 6 -> full, 6 is surplus
    assert sorted(p.metadata["id"] for p in prompts) == [2, 5]
    assert len(result.traces) == 6 and all(len(set(t.reward for t in result.traces[i:i + 3])) == 2
                                           for i in range(0, 6, 3))
    assert [prompts[t.prompt_index].metadata["id"] for t in result.traces[::3]] == \
        [p.metadata["id"] for p in prompts]  # renumbered in trace order
    assert metrics == {"rollout/groups_generated": 8.0, "rollout/groups_kept": 2.0,
                       "rollout/groups_dropped": 5.0, "rollout/groups_surplus": 1.0,
                       "rollout/sampling_rounds": 2.0}
    assert manager.seeds == [100, 100 + 4 * 3]  # each round its own seeds
    assert len(result.shards) == engines
    assert result.stats()["rollout/engine_failures"] == 2 * engines  # both rounds' faults


def test_plugin_filter_by_dotted_path(tmp_path):
    (tmp_path / "flt.py").write_text("def all_right(group):\n"
                                     "    return all(t.reward == 1.0 for t in group)\n")
    sampler = DynamicSampler(DynamicSamplingConfig(f"{tmp_path / 'flt.py'}:all_right"))
    prompts, _, metrics = sampler.collect(FakeManager(1), _stream(), 2, 3, RolloutConfig())
    assert [p.metadata["id"] for p in prompts] == [1, 3]
    assert metrics["rollout/groups_dropped"] == 2.0


def test_a_filter_that_never_passes_fails_loudly():
    sampler = DynamicSampler(DynamicSamplingConfig("pathlib:PurePath", max_rounds=3))
    sampler.keep = lambda group: False
    with pytest.raises(RuntimeError, match="3 rounds kept 0 of 2 groups"):
        sampler.collect(FakeManager(1), _stream(), 2, 3, RolloutConfig())


@pytest.fixture
def flags(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path)]


@pytest.mark.parametrize("extra, message", [
    (["--dynamic-sampling-filter-path", "no_such_module:f"], "--dynamic-sampling-filter-path"),
    (["--over-sampling-batch-size", "8"], "needs --dynamic-sampling-filter-path"),
    (["--dynamic-sampling-filter-path", "reward_nonzero_std", "--over-sampling-batch-size", "0"],
     "--over-sampling-batch-size must be >= 1")])
def test_bad_flags_name_themselves(flags, extra, message, capsys):
    with pytest.raises(SystemExit):
        parse_args([*flags, *extra])
    assert message in capsys.readouterr().err


def _prompt_file(tmp_path) -> str:
    """--prompt-data must name a file that exists (checked when the flags are parsed)."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "p", "label": "1"}\n')
    return str(path)
