"""Which checkpoints stay (``--save-retain``, Megatron's ``--save-retain-interval``) and the
flags' checks (``trainer/learner/checkpoint_policy.py``)."""

from __future__ import annotations

import argparse

import pytest

from trainer.learner.checkpoint_policy import (CheckpointPolicy, add_checkpoint_args,
                                               check_checkpoint_args, checkpoint_policy_from_args)


@pytest.mark.parametrize("retain,interval,removed", [
    (None, None, []),  # default: every checkpoint stays
    (2, None, [1, 2, 3]),  # the last two: 4 and 5
    (1, None, [1, 2, 3, 4]),
    (None, 2, [1, 3]),  # Megatron: the latest and the multiples of 2
    (2, 3, [1, 2]),  # the last two and 3
    (9, None, []),  # more than there are
])
def test_retention_keeps_the_last_k_and_the_multiples(retain, interval, removed):
    policy = CheckpointPolicy(retain=retain, retain_interval=interval)
    assert policy.to_remove([5, 1, 3, 2, 4]) == removed


def _parse(*argv):
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--save", default=None)
    add_checkpoint_args(p)
    args = p.parse_args(argv)
    check_checkpoint_args(p, args)
    return args


def test_flags_read_into_the_policy():
    policy = checkpoint_policy_from_args(_parse("--save", "d", "--save-retain", "3",
                                                "--no-save-optim", "--no-load-rng"))
    assert policy == CheckpointPolicy(save_optim=False, load_rng=False, retain=3)


@pytest.mark.parametrize("argv,message", [
    (["--save", "d", "--save-retain", "0"], "--save-retain must be >= 1"),
    (["--save-retain", "2"], "--save-retain / --save-retain-interval need --save"),
])
def test_bad_retention_flags_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert message in capsys.readouterr().err
