"""The learner's flags, read by ``learner/config.py``."""

from __future__ import annotations

from trainer.arguments import parse_args
from trainer.learner.config import learner_config_from_args


def test_resume_and_reference_models(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = learner_config_from_args(parse_args(
        ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path), "--load", "ck",
         "--ref-load", "ref", "--rollout-temperature", "0.7", "--lr", "3e-4"]))
    assert cfg.policy_model(resume=False).load == "ck"
    assert cfg.policy_model(resume=True).load is None  # the trainer checkpoint brings the weights
    assert (cfg.reference_model().load, cfg.reference_model().role) == ("ref", "reference")
    assert (cfg.train.temperature, cfg.optim.lr) == (0.7, 3e-4)
    assert cfg.global_batch_size == 32 * 8  # check_args: the whole rollout by default


def test_eviction_replay_flags(tmp_path, capsys):
    import pytest

    from trainer.rollout.config import sampling_config_from_args

    (tmp_path / "config.json").write_text("{}")
    base = ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path)]
    plain = parse_args(base)
    cfg = learner_config_from_args(plain)
    assert not cfg.train.sparse_recompute and not cfg.train.train_sparse_policy
    assert not sampling_config_from_args(plain).eviction_record
    args = parse_args(base + ["--train-sparse-policy"])
    cfg = learner_config_from_args(args)
    assert cfg.train.sparse_recompute and cfg.train.train_sparse_policy  # implied
    assert cfg.model.attention_backend == "sdpa"  # auto would pick TE, which ignores the masks
    assert sampling_config_from_args(args).eviction_record  # the rollouts ask for the records
    assert learner_config_from_args(parse_args(base + ["--sparse-recompute"])).train.sparse_recompute
    with pytest.raises(SystemExit):
        parse_args(base + ["--sparse-recompute", "--attention-backend", "te"])
    assert "--attention-backend sdpa" in capsys.readouterr().err


def _prompt_file(tmp_path) -> str:
    """--prompt-data must name a file that exists (checked when the flags are parsed)."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "p", "label": "1"}\n')
    return str(path)


def test_roles_train_the_policy_and_freeze_the_reference():
    from trainer.learner.config import LearnerConfig
    from trainer.learner.settings import ModelConfig, OptimConfig, TrainConfig

    cfg = LearnerConfig(ModelConfig("hf", load="ck"), OptimConfig(lr=1.0), TrainConfig(), 8,
                        ref_load="ref")
    policy, reference = cfg.roles(resume=True, with_reference=True)
    # a resume's weights come from its trainer checkpoint, not --load
    assert (policy.trainable, policy.load_weights, policy.model.load, policy.optim.lr) == \
        (True, False, None, 1.0)
    assert (reference.trainable, reference.load_weights, reference.model.load,
            reference.model.role) == (False, True, "ref", "reference")
    fresh = cfg.roles(resume=False, with_reference=False)
    assert [(r.model.role, r.model.load, r.load_weights) for r in fresh] == [("policy", "ck", True)]
