"""Pure-tensor RL algorithm pieces of the GRPO trainer (no Megatron, no distributed state).

- ``advantages``: GRPO / Dr.GRPO / RLOO / REINFORCE++(-baseline) token-level advantages.
- ``kl``: k1 / k2 / k3 / low_var_kl per-token KL estimators.
- ``policy_loss``: PPO clip (+ clip-higher, dual clip), KL loss, entropy bonus, aggregation.
- ``correction``: sparse-rollout correction π_old/π_sparse (IS weights, rejection, veto) + metrics.
- ``argparse_flags``: the command-line flags and their mapping to the config dataclasses.
"""

from trainer.algorithms.advantages import ESTIMATORS, AdvantageConfig, compute_advantages
from trainer.algorithms.correction import (
    PRESETS,
    CorrectionConfig,
    MISResult,
    compute_mis_weights,
    correction_preset,
    mismatch_metrics,
    row_correction,
    select_old_logp,
)
from trainer.algorithms.kl import KL_TYPES, kl_estimate
from trainer.algorithms.policy_loss import AGG_MODES, LossScale, PolicyLossConfig, aggregate, policy_loss

__all__ = [
    "AGG_MODES", "ESTIMATORS", "KL_TYPES", "PRESETS",
    "AdvantageConfig", "CorrectionConfig", "LossScale", "MISResult", "PolicyLossConfig",
    "aggregate", "compute_advantages", "compute_mis_weights", "correction_preset", "kl_estimate",
    "mismatch_metrics", "policy_loss", "row_correction", "select_old_logp",
]
