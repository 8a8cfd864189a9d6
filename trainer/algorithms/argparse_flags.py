"""Command-line flags of the RL algorithm (slime-style names) and their mapping to the configs.

Correction flags (other than ``--mis-preset``) are absent from the namespace unless given
(``argparse.SUPPRESS``): ``--mis-preset`` supplies the base values and only the flags actually
given override them, including an explicit ``none``. Their help text shows the reference
(``sparse_rl``) value.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

# names and configs without torch: --help and flag errors stay fast
from trainer.algorithms.settings import (AGG_MODES, ESTIMATORS, KL_TYPES, LEVELS, MODES, PRESETS,
                                         AdvantageConfig, CorrectionConfig, PolicyLossConfig,
                                         correction_preset)

_REF = CorrectionConfig()
_LOSS = PolicyLossConfig()


@dataclass
class AlgorithmConfig:
    advantage: AdvantageConfig
    loss: PolicyLossConfig
    correction: CorrectionConfig


def _optional_float(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "off") else float(text)


def add_algorithm_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the advantage, loss and sparse-correction flags on ``parser``."""
    g = parser.add_argument_group("algorithms: advantages")
    g.add_argument("--advantage-estimator", choices=ESTIMATORS, default="grpo",
                   help="advantage estimator (default: grpo, the reference's)")
    g.add_argument("--disable-grpo-std-normalization", action="store_true",
                   help="grpo without dividing by the group std (Dr.GRPO advantages)")
    g.add_argument("--gamma", type=float, default=AdvantageConfig.gamma,
                   help="discount of token rewards for reinforce_plus_plus (default: 1.0)")

    g = parser.add_argument_group("algorithms: policy loss")
    g.add_argument("--eps-clip", type=float, default=_LOSS.eps_clip,
                   help="PPO clip: ratio clipped below at 1 - eps (default: 0.2)")
    g.add_argument("--eps-clip-high", type=float, default=None,
                   help="PPO clip above at 1 + eps (clip-higher, DAPO uses 0.28; default: --eps-clip)")
    g.add_argument("--eps-clip-c", type=float, default=None,
                   help="dual-clip constant (> 1, e.g. 3.0) bounding the loss of negative-advantage "
                        "tokens; default: off")
    g.add_argument("--kl-loss-coef", type=float, default=_LOSS.kl_loss_coef,
                   help="weight of the KL(policy || reference) loss; 0 disables it and the reference "
                        f"model (default: {_LOSS.kl_loss_coef}, the reference run's)")
    g.add_argument("--kl-loss-type", choices=KL_TYPES, default=_LOSS.kl_loss_type,
                   help=f"KL estimator for the KL loss (default: {_LOSS.kl_loss_type})")
    g.add_argument("--entropy-coef", type=float, default=_LOSS.entropy_coef,
                   help="weight of the entropy bonus (default: 0)")
    g.add_argument("--loss-agg-mode", choices=AGG_MODES, default=_LOSS.loss_agg_mode,
                   help="token_mean: mean over all tokens; seq_mean_token_mean: mean over sequences of "
                        "per-sequence token means (slime default, reference); seq_mean_token_sum_norm: "
                        "Dr.GRPO, per-sequence token sums / --loss-agg-norm-length")
    g.add_argument("--loss-agg-norm-length", type=int, default=None,
                   help="constant length for seq_mean_token_sum_norm (default: --rollout-max-response-len)")

    g = parser.add_argument_group("algorithms: sparse-rollout correction (pi_old / pi_sparse)")
    g.add_argument("--mis-preset", choices=sorted(PRESETS), default="sparse_rl",
                   help="base correction settings; the flags below override single fields "
                        "(default: sparse_rl, the reference's mis.yaml)")
    g.add_argument("--use-mis", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help=f"apply importance weights pi_old/pi_sparse (reference: {_REF.use_mis})")
    g.add_argument("--mis-level", choices=LEVELS, default=argparse.SUPPRESS,
                   help=f"ratio level of the IS weights (reference: {_REF.level})")
    g.add_argument("--mis-mode", choices=MODES, default=argparse.SUPPRESS,
                   help="truncate: min(w, U); clip: clamp(w, L, U); mask: drop tokens with w outside "
                        f"[L, U] (reference: {_REF.mode})")
    g.add_argument("--mis-lower-bound", type=_optional_float, default=argparse.SUPPRESS,
                   help=f"L for clip/mask modes, 'none' = 1/U (reference: {_REF.lower_bound})")
    g.add_argument("--mis-upper-bound", type=float, default=argparse.SUPPRESS,
                   help=f"U for all modes (reference: {_REF.upper_bound})")
    g.add_argument("--use-mis-rs", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help=f"rejection sampling: drop tokens/sequences whose ratio is outside the RS bounds "
                        f"(reference: {_REF.use_rs})")
    g.add_argument("--mis-rs-level", choices=LEVELS, default=argparse.SUPPRESS,
                   help=f"ratio level of rejection sampling (reference: {_REF.rs_level})")
    g.add_argument("--mis-rs-lower-bound", type=_optional_float, default=argparse.SUPPRESS,
                   help="RS lower bound, 'none' = the IS lower bound (reference: none -> 0.5)")
    g.add_argument("--mis-rs-upper-bound", type=_optional_float, default=argparse.SUPPRESS,
                   help="RS upper bound, 'none' = the IS upper bound (reference: none -> 1.5)")
    g.add_argument("--mis-veto-threshold", type=_optional_float, default=argparse.SUPPRESS,
                   help="drop a whole sequence if any token has pi_old/pi_sparse below this; 'none' "
                        f"disables (reference: {_REF.veto_threshold})")
    g.add_argument("--mis-batch-normalize", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help=f"rescale IS weights to mean 1 over the batch (reference: {_REF.batch_normalize})")
    g.add_argument("--mis-bypass", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="pi_old := pi_sparse: skip the dense recompute, PPO ratio against rollout "
                        "logprobs, no IS weights (slime --use-rollout-logprobs)")
    return parser


# flag dest -> CorrectionConfig field
_CORRECTION_FLAGS = {
    "use_mis": "use_mis", "mis_level": "level", "mis_mode": "mode", "mis_lower_bound": "lower_bound",
    "mis_upper_bound": "upper_bound", "use_mis_rs": "use_rs", "mis_rs_level": "rs_level",
    "mis_rs_lower_bound": "rs_lower_bound", "mis_rs_upper_bound": "rs_upper_bound",
    "mis_veto_threshold": "veto_threshold", "mis_batch_normalize": "batch_normalize", "mis_bypass": "bypass",
}


def config_from_args(args: argparse.Namespace) -> AlgorithmConfig:
    """Build the advantage, loss and correction configs from flags parsed by ``add_algorithm_args``.

    ``seq_mean_token_sum_norm`` without ``--loss-agg-norm-length`` uses
    ``args.rollout_max_response_len`` when the namespace has it (the Dr.GRPO constant).
    """
    advantage = AdvantageConfig(estimator=args.advantage_estimator,
                                std_normalize=not args.disable_grpo_std_normalization, gamma=args.gamma)
    norm_length = args.loss_agg_norm_length
    if norm_length is None and args.loss_agg_mode == "seq_mean_token_sum_norm":
        norm_length = getattr(args, "rollout_max_response_len", None)
    loss = PolicyLossConfig(eps_clip=args.eps_clip, eps_clip_high=args.eps_clip_high, eps_clip_c=args.eps_clip_c,
                            kl_loss_coef=args.kl_loss_coef, kl_loss_type=args.kl_loss_type,
                            entropy_coef=args.entropy_coef, loss_agg_mode=args.loss_agg_mode,
                            loss_agg_norm_length=norm_length)
    overrides = {}
    for dest, field_name in _CORRECTION_FLAGS.items():
        if hasattr(args, dest):  # absent unless given on the command line
            overrides[field_name] = getattr(args, dest)
    correction = correction_preset(getattr(args, "mis_preset", "sparse_rl"), **overrides)
    return AlgorithmConfig(advantage=advantage, loss=loss, correction=correction)

