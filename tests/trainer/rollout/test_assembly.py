"""The rollout side built in one call (``rollout/assembly.py``), read back piece by piece: each
piece is built once over the pieces it needs, and nothing is swapped on it afterwards. Servers at
URLs nothing listens on: no engine starts."""

from __future__ import annotations

import socket
import types

import pytest

from trainer.arguments import parse_args
from trainer.rollout.assembly import RolloutInputs, assemble_rollout
from trainer.rollout.config import rollout_setup_from_args
from trainer.rollout.partial import ResumableBackend
from trainer.rollout.source import AsyncRolloutSource, SyncRollouts


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def side(tmp_path):
    """``side(*flags, hook=None)``: the rollout side of a run at rollout 2 of 5 on servers."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text('{"prompt": "p", "label": "1"}\n')
    built = []

    def build(*extra, hook=None):
        args = parse_args(["--hf-checkpoint", str(tmp_path), "--prompt-data",
                           str(tmp_path / "p.jsonl"), "--rollout-server-urls", _dead_url(),
                           *extra])
        inputs = RolloutInputs(None, None, types.SimpleNamespace(prompts=[]), {}, None, tmp_path,
                               tmp_path, False, start_rollout=2, num_rollout=5)
        built.append(assemble_rollout(rollout_setup_from_args(args), inputs, hook, "cpu"))
        return built[-1]

    yield build
    for s in built:
        s.close()


def test_a_synchronous_run_generates_on_its_engines_as_built(side):
    s = side()
    assert isinstance(s.source, SyncRollouts) and s.source.max_staleness is None
    assert s.manager.engines is s.sync.target  # weights and generation: the same servers
    assert s.generate.manager is s.manager and s.eval.rollouts is s.manager
    assert s.generation_gpus is None  # servers elsewhere: how many GPUs is not known


def test_partial_rollouts_wrap_the_engines_before_the_manager_is_built(side):
    """The gate interrupts the engines themselves; the manager generates through the
    resumable wrapper; weights, restarts and the gate's version take the engines as built."""
    given = []

    def hook(resync):
        given.append(resync)
        return lambda dead: None

    s = side("--max-staleness", "1", "--partial-rollout", hook=hook)
    wrapper, gate = s.manager.engines, s.source.gate
    assert isinstance(s.source, AsyncRolloutSource) and s.source.max_staleness == 1
    assert isinstance(wrapper, ResumableBackend) and wrapper.gate is gate
    engines = wrapper.backend
    assert s.sync.target is engines and gate.interrupt == engines.abort_all
    assert given == [s.sync.resync] and engines.on_engine_failure is not None
    assert gate.version == wrapper.default_version == 2 and s.source.start_rollout == 2


def test_staleness_without_partial_rollouts_waits_instead_of_interrupting(side):
    s = side("--max-staleness", "2")
    assert s.manager.engines is s.sync.target and s.source.gate.interrupt is None
    assert s.source.gate.max_staleness == 2
