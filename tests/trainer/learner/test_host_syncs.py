"""Host<->device synchronisations of the learner's passes, counted on the CPU
(``host_syncs.HostSyncCounter``: what a GPU run would wait for), at 2 and at 8 micro-batches.

The behaviour under test: a pass waits for the device a fixed number of times, whatever its
number of micro-batches -- the host queues micro-batch k + 1 while the device still runs k --
and each micro-batch reaches the device in one pinned, non-blocking copy.

Mutation checks (each fails ``test_syncs_do_not_grow_with_micro_batches``): a ``float(loss)``
in ``grpo_update.GRPOLoss.__call__`` (one scalar read per micro-batch); the loss's row ids
built with ``torch.tensor(ids, device=...)`` (a pageable copy per micro-batch); and
``test_counter_sees_each_kind_of_sync`` fails when any rule of the counter is dropped."""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import pytest
import torch

from checkpoint_tools import cpu_megatron


def _load_counter():
    """``host_syncs.HostSyncCounter``, by path: a spawned rank loads this file by path too, and
    sglang-kvc's own ``tests`` package shadows this one there."""
    spec = importlib.util.spec_from_file_location("host_syncs", Path(__file__).with_name(
        "host_syncs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HostSyncCounter


HostSyncCounter = _load_counter()

SAMPLES = 16
# tokens per micro-batch: 16 samples of 10-21 tokens (240) in 2 micro-batches, or in 8
BUDGETS = {2: 160, 8: 32}
PASSES = {"logprobs": 1, "update": 2, "fused_update": 1}  # forward passes over the micro-batches


def test_counter_sees_each_kind_of_sync():
    """The counter against hand-listed syncs: each device read or blocking copy once, host
    work and pinned non-blocking copies never."""
    counter = HostSyncCounter(root="tests/")
    weight = torch.ones(4)
    counter.mark(weight)
    with counter:
        x = weight * 2
        host = torch.arange(4)
        assert host.tolist() == [0, 1, 2, 3] and int(host.sum()) == 6  # host: free
        pinned = host.pin_memory().to("cuda", non_blocking=True)  # free
        assert counter.on_device(pinned) and not counter.on_device(host)
        x.sum().item()  # 1
        float(x[0])  # 2
        x[x > 1]  # 3: sized by the mask's values
        x.nonzero()  # 4
        x.tolist()  # 5
        moved = x.cpu()  # 6
        assert not counter.on_device(moved) and counter.on_device(x * moved)
        host.to("cuda")  # 7: pageable
        torch.tensor([1, 2], device="cuda")  # 8: from Python data
        if x.sum() > 0:  # 9
            pass
        torch.where(x > 1, x, 0.0).sum(-1)  # device work: free
        assert x.device.type == "cuda"  # a device tensor says so
    assert len(counter) == 9, counter.by_site()
    assert len(counter.uploads) == 3  # pinned, pageable, from data


def sync_task(rank, world, port, hf_dir):
    """Syncs and uploads of each pass at each micro-batch count, by site."""
    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    trainer = _trainer(hf_dir)
    samples, batch, ref = _rollout(trainer)
    _point_at_cuda()
    out = {}
    for micro, budget in BUDGETS.items():
        trainer.train_cfg.max_tokens_per_gpu = budget
        assert len(trainer._micro_batches(samples, list(range(SAMPLES)))) == micro
        out[micro] = {name: _count(trainer, run) for name, run in _passes(trainer, batch, ref)}
    return out


def _point_at_cuda():
    """The learner's copies go to "cuda" (served on the host by cpu_megatron's stand-ins), so
    that the counter tells device tensors from host ones."""
    import trainer.launch
    from trainer.learner import grpo_update, policy_trainer

    cuda = torch.device("cuda", 0)
    for module in (trainer.launch, grpo_update, policy_trainer):
        module.default_device = lambda: cuda


def _trainer(hf_dir, dtype=torch.float32):
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    return PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=dtype), OptimConfig(),
                         TrainConfig(max_tokens_per_gpu=BUDGETS[2]), load_weights=False)


def _rollout(trainer):
    from trainer.learner.grpo_update import RolloutBatch, gather_dp
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 400, (4 + i % 3,), generator=g).tolist(),
                      torch.randint(0, 400, (6 + i % 11,), generator=g).tolist())
               for i in range(SAMPLES)]
    current = gather_dp(trainer.compute_logprobs(samples), trainer)
    rollout = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in current]
    batch = RolloutBatch(samples, torch.rand(SAMPLES, generator=g), rollout,
                         n_samples_per_prompt=4)
    return samples, batch, [lp - 0.1 for lp in current]


def _passes(trainer, batch, ref):
    """(name, run) of each pass: a log-prob forward; the recipe's update (KL to a reference
    with batch-normalised IS weights: π_old recomputed first); the fused update (no KL)."""
    from trainer.algorithms import AdvantageConfig, PolicyLossConfig, correction_preset
    from trainer.learner.fused_old_logp import OldLogpPlan
    from trainer.learner.grpo_update import prepare_update, run_updates

    adv, corr = AdvantageConfig("grpo"), correction_preset("sparse_rl")

    def update(kl: float, plan):
        prep = prepare_update(trainer, batch, adv, corr, ref if kl else None, plan)
        run_updates(trainer, batch, prep, PolicyLossConfig(kl_loss_coef=kl), SAMPLES)

    return (("logprobs", lambda: trainer.compute_logprobs(batch.samples)),
            ("update", lambda: update(1e-4, None)),
            ("fused_update", lambda: update(0.0, OldLogpPlan(True, "test"))))


def _count(trainer, run) -> dict:
    counter = HostSyncCounter()
    counter.mark_module(trainer.model)
    with counter:
        run()
    return dict(syncs=dict(counter.by_site()), uploads=len(counter.uploads),
                upload_sites=dict(collections.Counter(counter.uploads)))


@pytest.fixture(scope="module")
def counts(tiny_model_factory):
    if torch.cuda.is_available():
        pytest.skip("with CUDA the GPU counts its own syncs: test_gpu_syncs_do_not_grow_...")
    hf = tiny_model_factory("qwen2-untied")
    (out,) = cpu_megatron.run_on_ranks((__file__, "sync_task"), 1, str(hf))
    for micro, passes in out.items():
        for name, c in passes.items():
            print(f"{micro} micro-batches, {name}: {sum(c['syncs'].values())} syncs, "
                  f"{c['uploads']} uploads")
            for site, n in c["syncs"].items():
                print(f"    {n} x {site}")
            for site, n in c["upload_sites"].items():
                print(f"    {n} x upload at {site}")
    return out


def test_syncs_do_not_grow_with_micro_batches(counts):
    """The same syncs, site by site, at 2 and at 8 micro-batches: a log-prob pass reads its
    log-probs back once; an update waits four times -- π_old to the host (the recompute's, or
    the fused forward's for the correction), Megatron's gradient clipping (its norm's
    ``.item()`` and the ``torch.tensor`` it makes of it) and the step's metrics, in one copy."""
    for name in PASSES:
        assert counts[8][name]["syncs"] == counts[2][name]["syncs"], name
        assert sum(counts[8][name]["syncs"].values()) == (1 if name == "logprobs" else 4), name


def test_one_upload_per_micro_batch(counts):
    """A micro-batch reaches the device in one pinned copy (tokens, targets, bounds, response
    positions, RoPE positions, its sample ids, the loss's row index): 8 micro-batches cost 6
    uploads more than 2 in each forward pass."""
    for name, passes in PASSES.items():
        assert counts[8][name]["uploads"] - counts[2][name]["uploads"] == 6 * passes, name


def gpu_sync_task(rank, world, port, hf_dir):
    """The GPU's own count (``torch.cuda.set_sync_debug_mode("warn")``: one warning per
    synchronising call, explicit ``torch.cuda.synchronize`` included) of each pass, in the
    run's dtype and kernels, after a warm-up at both budgets (compilation is not counted)."""
    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    trainer = _trainer(hf_dir, dtype=None)
    samples, batch, ref = _rollout(trainer)
    out = {}
    for _ in range(2):  # the first round warms up (compiles), the second is counted
        for micro, budget in BUDGETS.items():
            trainer.train_cfg.max_tokens_per_gpu = budget
            out[micro] = {name: _gpu_syncs(run) for name, run in _passes(trainer, batch, ref)}
    return out


def _gpu_syncs(run) -> int:
    """CUDA's own count (sync debug mode), as benchmarks/training/profile_train_step.py reports it."""
    from benchmarks.training.profile_train_step import count_syncs

    return count_syncs(run)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_syncs_do_not_grow_with_micro_batches(tiny_model_factory):
    hf = tiny_model_factory("qwen2-untied")
    (out,) = cpu_megatron.run_on_ranks((__file__, "gpu_sync_task"), 1, str(hf))
    print(out)
    assert out[8] == out[2]
