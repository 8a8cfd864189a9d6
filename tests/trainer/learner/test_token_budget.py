"""``--max-tokens-per-gpu`` from free memory (learner/token_budget.py): the formula by hand for
the 0.5B shape, its cap and floor, and a trainer that sizes itself from injected free memory
at its first pass and trains to the same gradient as a small fixed budget (the budget changes
speed, not the maths).

Mutation checks: dropping the logits' bytes or the pending Adam states from the formula fails
``test_budget_by_hand``; packing with the budget the trainer printed but not the one it uses,
or a loss normalised per micro-batch, fails ``test_auto_budget_same_gradient``."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron

QWEN25_05B = dict(model_type="qwen2", hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
GIB = 1 << 30


def _arch():
    from checkpoint_tools.model_config import arch_from_hf_config

    return arch_from_hf_config(dict(QWEN25_05B), source="test")


def test_budget_by_hand():
    from trainer.learner.token_budget import budget_for

    # a layer: 2 x (4 x 896 + 2 x (14 + 4) x 64 + 14 x 64 + 3 x 4864) + 4 x 14 = 42808 bytes;
    # 25 of them, logits and their gradient 4 x 151936, final norm 4 x 896: 1681528 a token
    budget = budget_for(_arch(), 40 * GIB, pending_optimizer_bytes=4e9)
    assert budget.bytes_per_token == 1681528
    usable = 0.85 * (40 * GIB - 4e9 - 2 * GIB)
    assert budget.usable_bytes == pytest.approx(usable)
    assert budget.tokens == int(usable / 1681528) // 1024 * 1024 == 18432


def test_recompute_cap_and_floor():
    from trainer.learner.token_budget import CAP, STEP, budget_for, bytes_per_token

    arch = _arch()
    # recompute keeps each layer's input (2 x 896 x 24) and two layers' worth
    assert bytes_per_token(arch, recompute=True) == 2 * 896 * 24 + 2 * 42808 + 4 * 151936 + 4 * 896
    assert budget_for(arch, 40 * GIB, recompute=True).tokens > budget_for(arch, 40 * GIB).tokens
    assert budget_for(arch, 500 * GIB).tokens == CAP
    assert budget_for(arch, 1 * GIB).tokens == STEP  # never below one step (a warning-free floor)
    assert budget_for(arch, 40 * GIB, tp=2).tokens > budget_for(arch, 40 * GIB).tokens


def test_startup_line_says_where_the_size_comes_from():
    """Issue 60: the run scripts no longer pin the micro-batch, so the start-up says which it
    is: the flag's value, or the size from free memory that the first pass prints."""
    from trainer.learner.token_budget import CAP, startup_line

    assert startup_line(12288) == "max tokens per GPU: 12288 (--max-tokens-per-gpu)"
    auto = startup_line(None)
    assert "sized from free memory at the first pass" in auto and f"up to {CAP}" in auto


def budget_task(rank, world, port, hf_dir, cache):
    from trainer.learner import token_budget
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.packing import Sample
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1, seed=1234)
    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 100, (p,), generator=g).tolist(),
                      torch.randint(0, 100, (r,), generator=g).tolist())
               for p, r in ((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5))]
    n_resp = sum(len(s.response_ids) for s in samples)
    loss = lambda lp, ent, ids: (sum(-x.sum() for x in lp) / n_resp, {})  # noqa: E731
    out = {}
    for budget in (20, None):
        if budget is None:  # injected: room for 2500 tokens beside the rest (budget 2048)
            arch = trainer.arch
            free = (token_budget.RESERVE + 16.0 * 1024 * arch.vocab_size + 8.0 * out[20][3]
                    + 2500 * token_budget.bytes_per_token(arch, False) / token_budget.SAFETY)
            token_budget.device_free_bytes = lambda: free
        trainer = PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                                OptimConfig(lr=0.0, clip_grad=0.0),
                                TrainConfig(max_tokens_per_gpu=budget), cache_dir=cache)
        groups = len(trainer._micro_batches(samples, list(range(len(samples)))))
        trainer.train_step(samples, loss)
        grads = {n: p.main_grad.detach().clone()
                 for n, p in trainer.model.module.named_parameters()}
        params = sum(p.numel() for p in trainer.model.module.parameters())
        out[budget] = (groups, trainer.train_cfg.max_tokens_per_gpu, grads, params)
    (small_groups, _, small, _), (auto_groups, auto_tokens, auto, _) = out[20], out[None]
    # plain numbers back (tensors do not travel back from a spawned rank in bulk)
    return dict(small_groups=small_groups, auto_groups=auto_groups, auto_tokens=auto_tokens,
                grad_max=max(g.abs().max().item() for g in small.values()),
                worst=max((small[n] - auto[n]).abs().max().item() for n in small))


def test_auto_budget_same_gradient(tiny_model_factory, tmp_path, capfd):
    hf = tiny_model_factory("qwen2-untied")
    r, = cpu_megatron.run_on_ranks((__file__, "budget_task"), 1, str(hf), str(tmp_path / "c"))
    assert r["auto_tokens"] == 2048 and r["small_groups"] > 1 and r["auto_groups"] == 1
    assert "max tokens per GPU: 2048 (from free memory: " in capfd.readouterr().out
    assert r["grad_max"] > 1e-3  # a real gradient
    assert r["worst"] < 1e-6
