"""Pure-tensor RL algorithm pieces of the GRPO trainer (no Megatron, no distributed state).

- ``advantages``: GRPO / Dr.GRPO / RLOO / REINFORCE++(-baseline) token-level advantages.
- ``kl``: k1 / k2 / k3 / low_var_kl per-token KL estimators.
- ``policy_loss``: PPO clip (+ clip-higher, dual clip), KL loss, entropy bonus, aggregation.
- ``correction``: sparse-rollout correction π_old/π_sparse (IS weights, rejection, veto) + metrics.
- ``settings``: the names each choice accepts and the advantage / loss / correction configs,
  without torch.
- ``argparse_flags``: the command-line flags and their mapping to the config dataclasses.

Names load on first use (as ``sglang_kvc``'s), so the flags build ``--help`` without torch.
"""

from __future__ import annotations

import importlib
import sys
import types

# public name -> its module here
_EXPORTS = {
    "ESTIMATORS": "settings", "KL_TYPES": "settings", "AGG_MODES": "settings", "PRESETS": "settings",
    "CorrectionConfig": "settings", "PolicyLossConfig": "settings", "correction_preset": "settings",
    "AdvantageConfig": "settings", "advantages_for": "advantages",
    "compute_advantages": "advantages",
    "MISResult": "correction", "compute_mis_weights": "correction",
    "mismatch_metrics": "correction", "row_correction": "correction", "select_old_logp": "correction",
    "kl_estimate": "kl",
    "LossScale": "policy_loss", "aggregate": "policy_loss", "policy_loss": "policy_loss",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """``policy_loss`` names a function and its module. Once the module loads (by any route), the
    import system sets it as this package's attribute: keep the function there instead, as the
    eager ``from .policy_loss import policy_loss`` did."""

    def __setattr__(self, name: str, value) -> None:
        if name == "policy_loss" and isinstance(value, types.ModuleType):
            value = value.policy_loss
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
