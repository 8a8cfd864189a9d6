"""The Megatron policy against the HF model: packed log-probs/entropy, gradients of a loss, and
parallel layouts (TP=2, DP=2) against TP=1. Megatron runs in spawned gloo ranks."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron
from checkpoint_tools.tiny_models import FAMILIES

TEMPERATURE = 0.7


def make_samples(vocab: int, shapes=((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5)), seed=0):
    from trainer.packing import Sample

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
    from trainer.forward import packed_logprobs
    from trainer.model_provider import ModelConfig, build_policy_model
    from trainer.packing import pack

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=tp)
    arch, model = build_policy_model(ModelConfig(hf_checkpoint=hf_dir), cache_dir=cache)
    batch = pack(samples)
    with torch.no_grad():
        lp, ent = packed_logprobs(model.eval(), batch, temperature=TEMPERATURE,
                                  vocab_size=arch.vocab_size, chunk_size=chunk, with_entropy=True)
    return batch.split_per_sample(lp), batch.split_per_sample(ent)


def _nll_loss(samples):
    total = sum(len(s.response_ids) for s in samples)  # global token count (all DP ranks)

    def loss_fn(logp, ent, ids):
        loss = sum(-(lp * (1 + 0.1 * i)).sum() for lp, i in zip(logp, ids)) / total
        return loss, {"loss": loss.item()}
    return loss_fn


def train_task(rank, world, port, hf_dir, cache, tp, samples, steps, save_dir, resume_from,
               save_at):
    from trainer.checkpoint import load_checkpoint, save_checkpoint
    from trainer.model_provider import ModelConfig
    from trainer.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=tp, seed=1234)
    trainer = PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir),
                            OptimConfig(lr=1e-2, lr_warmup_iters=1, lr_decay_style="cosine",
                                        lr_decay_iters=10, weight_decay=0.01),
                            TrainConfig(max_tokens_per_gpu=30, temperature=TEMPERATURE),
                            cache_dir=cache)
    start = 0
    if resume_from:
        start = load_checkpoint(trainer, resume_from)["next_step"]
    losses = []
    for step in range(start, steps):
        losses.append(trainer.train_step(samples, _nll_loss(samples))["loss"])
        if save_at is not None and step + 1 == save_at:
            save_checkpoint(trainer, save_dir, step + 1, extra={"next_step": step + 1})
    final_dir = f"{save_dir}-final"
    save_checkpoint(trainer, final_dir, steps, extra={"next_step": steps})
    return losses, final_dir


def _total_losses(per_rank):
    """Each rank reports its micro-batch loss sum; the global loss sums over DP ranks (and is
    replicated over TP ranks, so take TP rank 0's)."""
    return per_rank


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
