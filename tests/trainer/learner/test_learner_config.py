"""The learner's flags, read by ``learner/config.py``."""

from __future__ import annotations

from trainer.arguments import parse_args
from trainer.learner.config import learner_config_from_args


def test_resume_and_reference_models(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = learner_config_from_args(parse_args(
        ["--hf-checkpoint", str(tmp_path), "--prompt-data", "p.jsonl", "--load", "ck",
         "--ref-load", "ref", "--rollout-temperature", "0.7", "--lr", "3e-4"]))
    assert cfg.policy_model(resume=False).load == "ck"
    assert cfg.policy_model(resume=True).load is None  # the trainer checkpoint brings the weights
    assert (cfg.reference_model().load, cfg.reference_model().role) == ("ref", "reference")
    assert (cfg.train.temperature, cfg.optim.lr) == (0.7, 3e-4)
    assert cfg.global_batch_size == 32 * 8  # check_args: the whole rollout by default
