"""The learner's configs without torch: the model, its optimizer and schedule, the training
settings. Each default is written here once: the flags (``flags.py``) read them from these
fields (``default=OptimConfig.lr``), and the torch modules (``model_provider.py``,
``policy_trainer.py``) take the configs as they are, so ``--help`` never imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class ModelConfig:
    hf_checkpoint: str  # HF dir: architecture (config.json) and tokenizer
    load: str | None = None  # torch_dist root/iteration dir or an HF dir; default: hf_checkpoint
    dtype: torch.dtype | None = None  # default: bf16 on GPU, fp32 on CPU
    attention_backend: str = "auto"  # auto | te | sdpa | local
    recompute_activations: bool = False
    role: str = "policy"  # in startup messages: policy | reference


@dataclasses.dataclass
class OptimConfig:
    lr: float = 1e-6
    min_lr: float = 0.0
    lr_decay_style: str = "constant"  # constant | linear | cosine
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    use_distributed_optimizer: bool | None = None  # default: on with NCCL and DP > 1


@dataclasses.dataclass
class TrainConfig:
    # --max-tokens-per-gpu; None (its default, declared there only): sized from free memory at the
    # first pass, in one place (token_budget.resolve_max_tokens, called by _max_tokens)
    max_tokens_per_gpu: int | None = None
    log_probs_chunk_size: int = 1024
    temperature: float = 1.0  # --rollout-temperature: logits are divided by it everywhere
    sparse_recompute: bool = False  # π_old (and π_ref) attend as the sampler did (its records)
    train_sparse_policy: bool = False  # the update's forward too: GRPO on the compressed policy
    fused_old_logprobs: bool = True  # on-policy: π_old from the update's forward (fused_old_logp.py)
    sparse_attention: str = "auto"  # replay's attention (sparse_attention.SPARSE_IMPLS)
