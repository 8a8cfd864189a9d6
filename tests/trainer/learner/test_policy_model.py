"""The Megatron policy against the HF model: packed log-probs/entropy, gradients of a loss, and
parallel layouts (TP=2, DP=2) against TP=1. Megatron runs in spawned gloo ranks."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron
from checkpoint_tools.tiny_models import FAMILIES

TEMPERATURE = 0.7
# A resume is bit-exact on the CPU; GPU kernels with atomics (embedding backward) are not
# deterministic run to run, so there it is equal up to fp32 noise.
RESUME_TOL = 1e-7 if not torch.cuda.is_available() else 1e-5


def make_samples(vocab: int, shapes=((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5)), seed=0):
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(seed)
    return [Sample(torch.randint(0, vocab, (p,), generator=g).tolist(),
                   torch.randint(0, vocab, (r,), generator=g).tolist()) for p, r in shapes]


def hf_reference(hf_dir, samples, temperature=TEMPERATURE):
    """Per-sample response log-probs and entropies from transformers, one sequence at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    logps, ents = [], []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logsm = (model(ids).logits[0].float() / temperature).log_softmax(-1)
        p = len(s.prompt_ids)
        rows = logsm[p - 1:-1]
        logps.append(rows.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0])
        ents.append(-(rows.exp() * rows).sum(-1))
    return logps, ents


# --- tasks run on each spawned rank ------------------------------------------------------------

def logprob_task(rank, world, port, hf_dir, cache, tp, samples, chunk):
    from trainer.learner.forward import packed_logprobs
    from trainer.learner.model_provider import ModelConfig, build_policy_model
    from trainer.learner.packing import pack

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=tp)
    arch, model = build_policy_model(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                                     cache_dir=cache)
    batch = pack(samples).to(cpu_megatron.default_device())
    with torch.no_grad():
        lp, ent = packed_logprobs(model.eval(), batch, temperature=TEMPERATURE,
                                  vocab_size=arch.vocab_size, chunk_size=chunk, with_entropy=True)
    return [x.cpu() for x in batch.split_per_sample(lp)], [x.cpu() for x in batch.split_per_sample(ent)]


def _rl_configs():
    from trainer.algorithms import AdvantageConfig, CorrectionConfig, PolicyLossConfig

    return (AdvantageConfig(estimator="grpo"), CorrectionConfig(),
            PolicyLossConfig(kl_loss_coef=0.0, loss_agg_mode="seq_mean_token_mean"))


def _rollout(trainer, samples, k):
    """A deterministic stand-in for a sparse rollout: π_sparse = π_current + a known offset."""
    from trainer.learner.grpo_update import RolloutBatch, gather_dp

    current = gather_dp(trainer.compute_logprobs(samples), trainer)
    rollout = [lp + 0.05 * torch.cos(torch.arange(len(lp)) + i + k) for i, lp in enumerate(current)]
    rewards = torch.tensor([float((i * 7 + k) % 3 == 0) for i in range(len(samples))])
    return RolloutBatch(samples, rewards, rollout, n_samples_per_prompt=3)


def _make_trainer(hf_dir, cache, lr=1e-3, clip_grad=1.0):
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    # fp32 on every device: on a GPU box these layouts run over NCCL (distributed optimizer at
    # DP=2) and must still agree to fp32 tolerances
    return PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                         OptimConfig(lr=lr, lr_warmup_iters=1, lr_decay_style="cosine",
                                     lr_decay_iters=10, weight_decay=0.01, adam_eps=1e-6,
                                     clip_grad=clip_grad),
                         TrainConfig(max_tokens_per_gpu=30, temperature=TEMPERATURE),
                         cache_dir=cache)


def train_task(rank, world, port, hf_dir, cache, tp, samples, rollouts, save_dir, resume_from,
               save_after):
    """GRPO updates (2 optimizer steps per rollout); returns per-step losses + final ckpt dir."""
    from trainer.learner.checkpoint import load_checkpoint, save_checkpoint
    from trainer.learner.grpo_update import prepare_update, run_updates

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=tp, seed=1234)
    trainer = _make_trainer(hf_dir, cache)
    adv_cfg, corr_cfg, loss_cfg = _rl_configs()
    start = load_checkpoint(trainer, resume_from)["next_rollout"] if resume_from else 0
    losses = []
    for k in range(start, rollouts):
        batch = _rollout(trainer, samples, k)
        prep = prepare_update(trainer, batch, adv_cfg, corr_cfg)
        losses += [m["loss"] for m in run_updates(trainer, batch, prep, loss_cfg, 3)]
        if save_after is not None and k + 1 == save_after:
            save_checkpoint(trainer, save_dir, k + 1, extra={"next_rollout": k + 1})
    final = f"{save_dir}-final"
    save_checkpoint(trainer, final, rollouts, extra={"next_rollout": rollouts})
    return losses, final


def grad_task(rank, world, port, hf_dir, cache, samples):
    """Megatron gradients (by parameter name) of the policy loss with π_θ = π_old = π_ref."""
    from trainer.algorithms import AdvantageConfig, CorrectionConfig, LossScale, PolicyLossConfig
    from trainer.learner.grpo_update import gather_dp, make_loss_fn, prepare_update

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    trainer = _make_trainer(hf_dir, cache, lr=0.0, clip_grad=0.0)
    batch = _rollout(trainer, samples, 0)
    ref = gather_dp(trainer.compute_logprobs(samples), trainer)
    prep = prepare_update(trainer, batch, AdvantageConfig("grpo"), CorrectionConfig(), ref)
    loss_cfg = PolicyLossConfig(kl_loss_coef=0.1, kl_loss_type="k3", entropy_coef=0.01,
                                eps_clip=0.2, eps_clip_c=3.0, loss_agg_mode="token_mean")
    scale = LossScale.for_batch(prep.loss_mask)
    metrics = trainer.train_step(samples, make_loss_fn(prep, loss_cfg, scale), with_entropy=True)
    grads = {name: p.main_grad.detach().float().cpu()
             for name, p in trainer.model.module.named_parameters()}
    return grads, metrics, {k: getattr(prep, k) for k in
                            ("advantages", "old_logp", "weights", "loss_mask", "ref_logp")}


# --- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_logprobs_and_entropy_match_hf(family, tiny_model_factory, tmp_path):
    hf = tiny_model_factory(family)
    samples = make_samples(448)
    (logp, ent), = cpu_megatron.run_on_ranks((__file__, "logprob_task"), 1, str(hf), str(tmp_path / "c"), 1,
                                             samples, 5)
    ref_logp, ref_ent = hf_reference(hf, samples)
    for a, b in zip(logp, ref_logp):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for a, b in zip(ent, ref_ent):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_vocab_parallel_logprobs_match_hf_at_tp2(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2-untied")
    samples = make_samples(448)
    results = cpu_megatron.run_on_ranks((__file__, "logprob_task"), 2, str(hf), str(tmp_path / "c"), 2,
                                        samples, 7)
    ref_logp, ref_ent = hf_reference(hf, samples)
    for logp, ent in results:  # both TP ranks hold the full result
        for a, b in zip(logp, ref_logp):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        for a, b in zip(ent, ref_ent):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def _export(ckpt_root, hf_dir, out):
    from checkpoint_tools.megatron2hf import convert_torch_dist_to_hf

    from safetensors import safe_open
    path = convert_torch_dist_to_hf(ckpt_root, out, origin_hf_dir=hf_dir, progress=False)
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def tp1_run(tiny_model_factory, tmp_path_factory):
    hf = tiny_model_factory("qwen2-untied")
    tmp = tmp_path_factory.mktemp("tp1")
    samples = make_samples(448)
    (losses, final), = cpu_megatron.run_on_ranks((__file__, "train_task"), 1, str(hf),
                                                 str(tmp / "c"), 1, samples, 2, str(tmp / "s"),
                                                 None, 1)
    return hf, samples, losses, _export(final, hf, tmp / "hf"), tmp


@pytest.mark.parametrize("tp,world", [(2, 2), (1, 2)], ids=["tp2", "dp2"])
def test_tp2_and_dp2_match_tp1(tp, world, tp1_run, tmp_path):
    hf, samples, losses, weights, _ = tp1_run
    results = cpu_megatron.run_on_ranks((__file__, "train_task"), world, str(hf),
                                        str(tmp_path / "c"), tp, samples, 2, str(tmp_path / "s"),
                                        None, None)
    assert len(losses) == 4 and len({round(x, 6) for x in losses}) > 1
    for rank_losses, _ in results:  # every rank reports the global (DP-summed) loss
        assert rank_losses == pytest.approx(losses, abs=1e-5)
    other = _export(results[0][1], hf, tmp_path / "hf")
    initial = _export_initial(hf)
    for name, w in weights.items():
        torch.testing.assert_close(other[name], w, atol=2e-5, rtol=0, msg=name)
    assert any(not torch.equal(weights[n], initial[n]) for n in weights)  # training moved them


def _export_initial(hf):
    from safetensors import safe_open
    with safe_open(hf / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_save_load_then_continue_equals_uninterrupted(tp1_run, tmp_path):
    hf, samples, losses, weights, tmp = tp1_run
    # the TP=1 run saved after its first rollout (2 optimizer steps) under tmp/"s"
    (resumed_losses, final), = cpu_megatron.run_on_ranks(
        (__file__, "train_task"), 1, str(hf), str(tmp / "c"), 1, samples, 2,
        str(tmp_path / "s2"), str(tmp / "s"), None)
    assert resumed_losses == pytest.approx(losses[2:], abs=RESUME_TOL)
    resumed = _export(final, hf, tmp_path / "hf")
    for name, w in weights.items():
        torch.testing.assert_close(resumed[name], w, atol=RESUME_TOL, rtol=0, msg=name)


def test_dp2_save_load_then_continue_equals_uninterrupted(tp1_run, tmp_path):
    """Per-DP-rank optimizer state (the distributed optimizer's shards on NCCL) resumes exactly."""
    hf, samples, losses, _, _ = tp1_run
    args = (str(hf), str(tmp_path / "c"), 1, samples, 2)
    first = cpu_megatron.run_on_ranks((__file__, "train_task"), 2, *args, str(tmp_path / "s"),
                                      None, 1)
    resumed = cpu_megatron.run_on_ranks((__file__, "train_task"), 2, *args, str(tmp_path / "s2"),
                                        str(tmp_path / "s"), None)
    assert first[0][0] == pytest.approx(losses, abs=1e-5)
    for (rank_losses, _), (uninterrupted, _) in zip(resumed, first):
        assert rank_losses == pytest.approx(uninterrupted[2:], abs=RESUME_TOL)
    a, b = _export(first[0][1], hf, tmp_path / "a"), _export(resumed[0][1], hf, tmp_path / "b")
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=RESUME_TOL, rtol=0, msg=name)


def test_policy_loss_gradient_matches_hf(tiny_model_factory, tmp_path):
    from transformers import AutoModelForCausalLM

    from checkpoint_tools.mapping import hf_to_megatron_layer
    from checkpoint_tools.model_config import load_arch
    from trainer.algorithms import LossScale, PolicyLossConfig, policy_loss

    hf = tiny_model_factory("qwen3")
    samples = make_samples(448)
    (grads, metrics, prep), = cpu_megatron.run_on_ranks((__file__, "grad_task"), 1, str(hf),
                                                        str(tmp_path / "c"), samples)
    # π_θ = π_old = π_ref at the first step: every log ratio exactly 0 (so ratio exactly 1; the
    # mean metric itself is an fp32 sum / count), no clipping, zero KL. On a GPU the grad-mode
    # and no-grad forwards may pick different kernels: equal up to fp32 rounding there.
    exact = 0.0 if not torch.cuda.is_available() else 1e-6
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=exact)
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=exact) and metrics["clipfrac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    logps, ents = [], []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logsm = (model(ids).logits[0].float() / TEMPERATURE).log_softmax(-1)[len(s.prompt_ids) - 1:-1]
        logps.append(logsm.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0])
        ents.append(-(logsm.exp() * logsm).sum(-1))
    width = prep["advantages"].shape[1]
    pad = lambda rows: torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    cfg = PolicyLossConfig(kl_loss_coef=0.1, kl_loss_type="k3", entropy_coef=0.01, eps_clip=0.2,
                           eps_clip_c=3.0, loss_agg_mode="token_mean")
    loss, _ = policy_loss(pad(logps), prep["old_logp"], prep["advantages"], prep["loss_mask"], cfg,
                          mis_weights=prep["weights"], ref_logp=prep["ref_logp"],
                          entropy=pad(ents), loss_scale=LossScale.for_batch(prep["loss_mask"]))
    loss.backward()
    hf_grads = {n: p.grad for n, p in model.named_parameters()}
    arch = load_arch(hf)
    expected = {"embedding.word_embeddings.weight": hf_grads["model.embed_tokens.weight"],
                "decoder.final_layernorm.weight": hf_grads["model.norm.weight"]}
    local_names = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                   "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
    for i in range(arch.num_layers):
        for suffix, g in hf_to_megatron_layer(arch, hf_grads.__getitem__, i).items():
            g = torch.cat(g) if isinstance(g, tuple) else g
            expected[f"decoder.layers.{i}.{local_names.get(suffix, suffix)}"] = g
    assert set(expected) == set(grads)
    for name, g in expected.items():
        ours = grads[name][: g.shape[0]]
        rel = (ours - g).norm() / g.norm().clamp_min(1e-30)
        assert rel < 1e-4, f"{name}: relative gradient error {rel:.2e}"
    assert not grads["embedding.word_embeddings.weight"][arch.vocab_size:].any()  # padding rows
