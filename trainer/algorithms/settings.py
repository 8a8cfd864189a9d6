"""The algorithms' settings without their tensor code: the names each choice accepts and the
advantage, loss and correction configs, so the flags (``argparse_flags.py``) build ``--help`` and check
values without importing torch. The tensor modules re-export what they use from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
LEVELS = ("token", "sequence", "geometric")  # of the correction's ratios
MODES = ("truncate", "mask", "clip")  # of the correction's IS weights


@dataclass
class AdvantageConfig:
    """The advantage estimator and its settings (``advantages.advantages_for`` applies them)."""

    estimator: str = "grpo"  # slime --advantage-estimator / verl algorithm.adv_estimator
    std_normalize: bool = True  # grpo only; slime --disable-grpo-std-normalization sets False
    eps: float = 1e-6  # added to the group std (slime and verl use 1e-6)
    gamma: float = 1.0  # slime --gamma / verl algorithm.gamma; reinforce_plus_plus only

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown advantage estimator {self.estimator!r}; expected one of {ESTIMATORS}")


@dataclass
class PolicyLossConfig:
    """Defaults are the reference run's (Sparse-RL run-qwen2.5-3b-rkv.sh)."""

    eps_clip: float = 0.2  # slime --eps-clip / verl actor.clip_ratio_low: lower clip 1 - eps_clip
    eps_clip_high: float | None = None  # slime --eps-clip-high / verl clip_ratio_high; None = eps_clip (DAPO: 0.28)
    eps_clip_c: float | None = None  # slime --eps-clip-c / verl clip_ratio_c (dual clip, > 1, e.g. 3.0); None = off
    kl_loss_coef: float = 1e-4  # slime --kl-loss-coef / verl kl_loss_coef; 0 = no KL term (no ref model needed)
    kl_loss_type: str = "low_var_kl"  # slime --kl-loss-type / verl kl_loss_type: k1|k2|k3|low_var_kl
    entropy_coef: float = 0.0  # slime --entropy-coef / verl entropy_coeff
    loss_agg_mode: str = "seq_mean_token_mean"  # verl loss_agg_mode; slime default = per-sample token mean
    loss_agg_norm_length: int | None = None  # seq_mean_token_sum_norm's constant L (the max response length)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_clip < 1.0:
            raise ValueError(f"eps_clip must be in [0, 1), got {self.eps_clip}")
        if self.eps_clip_high is not None and self.eps_clip_high < 0.0:
            raise ValueError(f"eps_clip_high must be >= 0, got {self.eps_clip_high}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {self.eps_clip_c}")
        if self.kl_loss_type not in KL_TYPES:
            raise ValueError(f"unknown kl_loss_type {self.kl_loss_type!r}; expected one of {KL_TYPES}")
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}; expected one of {AGG_MODES}")
        if self.loss_agg_mode == "seq_mean_token_sum_norm" and not self.loss_agg_norm_length:
            raise ValueError("seq_mean_token_sum_norm needs loss_agg_norm_length (e.g. the max response length)")

    @property
    def clip_high(self) -> float:
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high

    @property
    def needs_ref_logp(self) -> bool:
        return self.kl_loss_coef != 0.0

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef != 0.0


@dataclass
class CorrectionConfig:
    """Sparse-rollout correction settings; field comments give the reference / verl names."""

    use_mis: bool = True  # mis.yaml use_tis / verl rollout_is != null: apply IS weights
    level: str = "token"  # mis.yaml tis_level / verl rollout_is: token|sequence|geometric
    mode: str = "truncate"  # mis.yaml tis_mode: truncate (TIS) | mask (MIS) | clip
    lower_bound: float | None = 0.5  # mis.yaml tis_lower_bound (clip/mask modes); None -> 1/upper_bound
    upper_bound: float = 1.5  # mis.yaml tis_upper_bound / verl rollout_is_threshold
    use_rs: bool = True  # mis.yaml use_rs / verl rollout_rs != null: rejection sampling
    rs_level: str = "token"  # mis.yaml rs_level
    rs_lower_bound: float | None = None  # mis.yaml rs_lower_bound; None -> the IS lower bound
    rs_upper_bound: float | None = None  # mis.yaml rs_upper_bound; None -> the IS upper bound
    veto_threshold: float | None = 1e-4  # mis.yaml rs_veto_threshold / verl rollout_token_veto_threshold
    batch_normalize: bool = True  # mis.yaml tis_batch_normalize / verl rollout_is_batch_normalize
    bypass: bool = False  # slime --use-rollout-logprobs / verl bypass_mode: pi_old := pi_sparse

    def __post_init__(self) -> None:
        for name, value, allowed in (("level", self.level, LEVELS), ("rs_level", self.rs_level, LEVELS),
                                     ("mode", self.mode, MODES)):
            if value not in allowed:
                raise ValueError(f"unknown correction {name} {value!r}; expected one of {allowed}")
        if not self.upper_bound > 0:
            raise ValueError(f"upper_bound must be > 0, got {self.upper_bound}")
        if self.mode != "truncate" and not 0 <= self.is_lower_bound < self.upper_bound:
            raise ValueError(f"need 0 <= lower_bound < upper_bound, got {self.is_lower_bound}, {self.upper_bound}")
        if self.use_rs and not 0 <= self.rs_lower < self.rs_upper:
            raise ValueError(f"need 0 <= rs_lower_bound < rs_upper_bound, got {self.rs_lower}, {self.rs_upper}")
        if self.veto_threshold is not None and not 0 < self.veto_threshold < 1:
            raise ValueError(f"veto_threshold must be in (0, 1), got {self.veto_threshold}")

    @property
    def is_lower_bound(self) -> float:
        return 1.0 / self.upper_bound if self.lower_bound is None else self.lower_bound

    @property
    def rs_lower(self) -> float:
        return self.is_lower_bound if self.rs_lower_bound is None else self.rs_lower_bound

    @property
    def rs_upper(self) -> float:
        return self.upper_bound if self.rs_upper_bound is None else self.rs_upper_bound

    @property
    def needs_dense_recompute(self) -> bool:
        """Whether π_old must be recomputed by the trainer (False in bypass mode)."""
        return not self.bypass

    @property
    def needs_batch_normalizer(self) -> bool:
        """Whether the weights are divided by a batch-wide mean (the one step that is not
        per row: a micro-batch alone cannot compute it)."""
        return self.use_mis and self.batch_normalize and not self.bypass


# Named presets. "sparse_rl" is the reference (mis.yaml); the "decoupled_*"/"bypass_*" ones are
# verl's rollout_correction presets (peers.md §6) with verl's default thresholds: IS truncation
# at 2.0, sequence RS [0.5, 2.0], geometric RS [1/1.001, 1.001] with veto 1e-4, no batch norm.
# verl's k3-divergence RS presets are not offered (this module only rejects on ratio bounds).
_VERL_OFF = dict(use_rs=False, veto_threshold=None, batch_normalize=False)
PRESETS: dict[str, dict] = {
    "sparse_rl": {},
    "disabled": dict(use_mis=False, **_VERL_OFF),  # metrics only
    "decoupled_token_is": dict(level="token", mode="truncate", lower_bound=None, upper_bound=2.0, **_VERL_OFF),
    "decoupled_seq_is": dict(level="sequence", mode="truncate", lower_bound=None, upper_bound=2.0, **_VERL_OFF),
    "decoupled_seq_is_rs": dict(level="sequence", mode="truncate", lower_bound=None, upper_bound=2.0,
                                use_rs=True, rs_level="sequence", rs_lower_bound=0.5, rs_upper_bound=2.0,
                                veto_threshold=None, batch_normalize=False),
    "decoupled_geo_rs": dict(use_mis=False, use_rs=True, rs_level="geometric", rs_lower_bound=1 / 1.001,
                             rs_upper_bound=1.001, veto_threshold=1e-4, batch_normalize=False),
    "decoupled_geo_rs_token_tis": dict(level="token", mode="truncate", lower_bound=None, upper_bound=2.0,
                                       use_rs=True, rs_level="geometric", rs_lower_bound=1 / 1.001,
                                       rs_upper_bound=1.001, veto_threshold=1e-4, batch_normalize=False),
    "bypass_ppo_clip": dict(bypass=True, use_mis=False, **_VERL_OFF),
}


def correction_preset(name: str, **overrides) -> CorrectionConfig:
    """The named preset, with any field overridden by keyword."""
    if name not in PRESETS:
        raise ValueError(f"unknown correction preset {name!r}; expected one of {sorted(PRESETS)}")
    return replace(CorrectionConfig(**PRESETS[name]), **overrides)
