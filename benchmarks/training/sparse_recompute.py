"""Eviction replay's cost: π_old recompute, train-step and whole-rollout (recompute + update
sharing their masks) tokens/s with the sampler's eviction masks (``--sparse-recompute`` /
``--train-sparse-policy``) against the dense packed attention (varlen on CUDA), on RL-shaped
packed batches, plus the time to build one micro-batch's masks: the first build (cold) apart,
then min / median / max over warm builds of the step's micro-batches and the median per stage
(records to the device, every layer's tiles, one training pass's BlockMasks; and the per-layer
``from_kv_blocks`` build this replaced, ``legacy_layers``, on the same masks). Also how many
graphs torch.compile made in the warm-up and during the timed steps (should be 0: a recompile
there is a recompile per micro-batch), and with ``--profile`` the top CUDA kernels and CPU ops of
one recompute and one train step of each mode (dense, flex), and their device time by kernel
family (attention, GEMMs, log-probs, ...; in the JSON under ``profile``) (``TORCH_LOGS=recompiles`` names the guards).

    python -m benchmarks.training.sparse_recompute                       # 0.5B shape, GPU
    python -m benchmarks.training.sparse_recompute --shape tiny --response-len 300 --budget 64 \\
        --divide-length 16 --seqs-per-step 4 --max-tokens-per-gpu 1024 --steps 1   # CPU smoke

Random weights. Records are R-KV-shaped: every ``--divide-length`` steps past ``--budget``
held tokens, each layer and KV head keeps the window plus a random ``budget - window`` of the
rest (scattered kept sets: the costly case for tiled kernels). Responses have
``--response-len`` tokens (``--vary-lengths``: uniform in [0.5, 1] x that). Prints numbers,
asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.common.report import emit, spread
from benchmarks.training.train_step import SHAPES, build_trainer, nll_loss, sync, time_repeats
from trainer.learner.flags import SPARSE_IMPLS, sparse_impl


def rkv_like_record(L: int, H: int, prompt: int, n: int, budget: int, divide: int, window: int,
                    g: torch.Generator) -> torch.Tensor:
    """[L, H, n] first query that misses each key, for random kept sets per layer and head."""
    evict = torch.full((L, H, n), n, dtype=torch.int32)
    held = torch.arange(prompt).expand(L, H, prompt)
    for i in range(prompt, n - 1):  # decode step feeding position i, compaction after it
        if held.shape[-1] + 1 < budget + divide:
            held = torch.cat([held, torch.full((L, H, 1), i)], -1)
            continue
        held = torch.cat([held, torch.full((L, H, 1), i)], -1)
        old = held[..., :-window]
        scores = torch.rand(old.shape, generator=g)
        top = scores.topk(budget - window, dim=-1).indices
        kept_old = old.gather(-1, top)
        dropped = torch.ones_like(old, dtype=torch.bool).scatter_(-1, top, False)
        evict.view(L * H, n)[torch.arange(L * H).repeat_interleave(dropped.sum(-1).flatten()),
                             old[dropped]] = i + 1
        held = torch.cat([kept_old.sort(-1).values, held[..., -window:]], -1)
    return evict.to(torch.int16 if n < 32767 else torch.int32)


def make_samples(args, arch) -> list:
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = []
    for _ in range(args.seqs_per_step):
        r = rng.randint(args.response_len // 2, args.response_len) if args.vary_lengths \
            else args.response_len
        n = args.prompt_len + r
        ids = torch.randint(0, arch.vocab_size, (n,), generator=g).tolist()
        rec = rkv_like_record(arch.num_layers, arch.num_query_groups, args.prompt_len, n,
                              args.budget, args.divide_length, args.window, g)
        out.append(Sample(ids[:args.prompt_len], ids[args.prompt_len:], rec))
    return out


def _timed_ms(fn):
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, 1e3 * (time.perf_counter() - start)


def build_masks_once(samples, group, arch, device) -> dict:
    """One micro-batch's masks as the update builds them, stage by stage (ms): the records to
    the device, every layer's block tiles, and one training pass's per-layer BlockMasks (the
    backward's tiles too)."""
    from trainer.learner.sparse_attention import EvictionMasks
    from trainer.learner.transfer import single_threaded

    picked = [samples[i] for i in group]
    lengths = [s.length for s in picked]

    def records_to_device():
        with single_threaded():  # as ``pack`` builds them in the trainer
            return EvictionMasks.from_records([s.eviction_record for s in picked], lengths,
                                              arch.num_layers, arch.num_query_groups,
                                              sum(lengths), device)

    masks, records = _timed_ms(records_to_device)
    _, tiles = _timed_ms(masks.tiles)
    with torch.enable_grad():
        _, layers = _timed_ms(lambda: masks.use().block_masks(arch.num_attention_heads))
    _, legacy = _timed_ms(lambda: legacy_block_masks(masks, arch))
    return dict(records=records, tiles=tiles, layers=layers, total=records + tiles + layers,
                legacy_layers=legacy)


def legacy_block_masks(masks, arch) -> list:
    """The per-layer build this replaced, for a comparison on the same GPU: each layer's tiles
    classified, repeated to query heads and sorted on their own, and ``from_kv_blocks``
    deriving the backward's tiles (vmapped scatters, one more sort)."""
    from torch.nn.attention.flex_attention import BlockMask

    from trainer.learner.sparse_attention import BLOCK, block_classes

    group, n = arch.num_attention_heads // arch.num_query_groups, masks.seq_id.shape[0]
    out = []
    for layer in range(arch.num_layers):
        ev = masks.evict[layer]
        tiles = [x.repeat_interleave(group, dim=0) for x in block_classes(ev, masks.seq_id)]
        ordered = [(x.sum(-1, dtype=torch.int32)[None], torch.argsort(
            (~x).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None]) for x in tiles]
        out.append(BlockMask.from_kv_blocks(
            *ordered[0], *ordered[1], BLOCK_SIZE=BLOCK, seq_lengths=(n, n),
            mask_mod=_legacy_mask_mod(masks.seq_id, ev, group)))
    return out


def _legacy_mask_mod(seq_id: torch.Tensor, ev: torch.Tensor, group: int):
    """The element mask the per-layer build used: same sample, causal, not yet evicted."""
    def mask_mod(b, h, qi, kj):
        return (seq_id[qi] == seq_id[kj]) & (kj <= qi) & (qi < ev[h // group, kj])

    return mask_mod


def mask_build_ms(samples, arch, max_tokens: int, device, warm_builds: int = 6) -> dict:
    """Every layer's masks of one micro-batch, built from scratch: the first build (cold:
    kernels loaded, caches empty) apart, then min / median / max over at least ``warm_builds``
    builds of the step's micro-batches, and the median of each stage."""
    from trainer.learner.packing import split_by_token_budget

    groups = split_by_token_budget([s.length for s in samples], max_tokens)
    cold = build_masks_once(samples, groups[0], arch, device)
    rounds = -(-warm_builds // len(groups))
    warm = [build_masks_once(samples, g, arch, device) for _ in range(rounds) for g in groups]
    total = [w["total"] for w in warm]
    return dict(cold=round(cold["total"], 2), **spread(total),
                **{f"{k}_median": round(statistics.median(w[k] for w in warm), 2)
                   for k in ("records", "tiles", "layers", "legacy_layers")})


def tile_work(samples, arch, max_tokens: int) -> dict:
    """The 128 x 128 tiles each attention computes per layer and KV head, summed over the
    step's micro-batches (CPU-countable, what a kernel's time mostly follows): dense causal
    (what the varlen kernel covers) and FlexAttention replay over the pack's grid; partial tiles
    are masked per element, full ones not. ``pairs``: the (query, key) pairs replay really
    attends (the floor)."""
    from trainer.learner.packing import split_by_token_budget

    total = {"dense": [0, 0], "flex": [0, 0], "pairs": [0]}
    for group in split_by_token_budget([s.length for s in samples], max_tokens):
        for name, counts in pack_tiles([samples[i] for i in group], arch).items():
            total[name] = [a + b for a, b in zip(total[name], counts)]
    per = arch.num_layers * arch.num_query_groups
    out = {name: dict(partial=round(p / per), full=round(f / per), total=round((p + f) / per))
           for name, (p, f) in ((k, v) for k, v in total.items() if k != "pairs")}
    out["pairs_per_tile_area"] = round(total["pairs"][0] / per / BLOCK_AREA)
    out["flex_over_dense"] = round(out["flex"]["total"] / out["dense"]["total"], 3)
    return out


def pack_tiles(picked: list, arch) -> dict:
    """One micro-batch's (partial, full) tile counts of each attention, and its attended pairs."""
    from trainer.learner.sparse_attention import EvictionMasks

    lengths = [s.length for s in picked]
    args = (lengths, arch.num_layers, arch.num_query_groups, sum(lengths))
    masks = EvictionMasks.from_records([s.eviction_record for s in picked], *args)
    dense = EvictionMasks.from_records([None] * len(picked), *args)
    out = {name: (int(t.kv[0].sum()), int(t.full_kv[0].sum()))
           for name, t in (("dense", dense.tiles()), ("flex", masks.tiles()))}
    rows = torch.arange(masks.evict.shape[-1])
    out["pairs"] = (int((masks.evict - rows).clamp(min=0)[..., masks.real].sum()),)
    return out


BLOCK_AREA = 128 * 128


def compiled_graphs() -> int:
    """Graphs torch.compile has made so far in this process (FlexAttention, fused kernels)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def profile_phase(name: str, step) -> dict:
    """The top CUDA kernels and CPU ops of one call of ``step``, how busy the GPU was, and its
    device time by kernel family (``profile_train_step.FAMILIES``: attention, GEMMs, gathers
    and scatters, ...), which is returned."""
    from benchmarks.training.profile_train_step import kernel_families

    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        step()
        sync()
    elapsed = time.perf_counter() - start
    events = prof.key_averages()
    for key in (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]:
        print(f"--- {name}: top by {key} ---")
        print(events.table(sort_by=key, row_limit=25, max_name_column_width=80))
    if not cuda:
        return {}
    busy = sum(e.self_device_time_total for e in events) / 1e3
    print(f"{name}: GPU kernel time {busy:.0f} ms in {elapsed * 1e3:.0f} ms "
          f"({busy / (elapsed * 1e3):.0%} busy, profiler overhead included)")
    families = kernel_families(events)
    print(f"{name}: device ms by kernel family {families}")
    return dict(wall_ms=round(elapsed * 1e3, 1), kernel_ms=families)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=4096)
    p.add_argument("--vary-lengths", action="store_true")
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--divide-length", type=int, default=128)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--seqs-per-step", type=int, default=16)
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--log-probs-chunk-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sparse-impl", nargs="+", default=None, type=sparse_impl,
                   choices=list(SPARSE_IMPLS),
                   help="the replay attention(s) to time against dense (default: flex on CUDA, "
                        "the mask path on the CPU); the first is reported as 'sparse', the "
                        "others as 'sparse_<impl>'")
    p.add_argument("--tiles-only", action="store_true",
                   help="count the attention tiles of dense and flex replay on the "
                        "step's micro-batches (no model, no timing: runs anywhere)")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true",
                   help="print the top CUDA kernels and CPU ops of one sparse recompute and one "
                        "sparse train step (torch.profiler)")
    return p.parse_args(argv)


def phases(trainer, samples, loss_fn, sparse: bool, impl: str = "auto") -> dict:
    """The timed calls. The recompute and the update each build their own masks (the update
    alone is the fused on-policy step); ``rollout`` is one rollout's recompute then update
    sharing them (``shared_replay_masks``, as the training loop runs it). ``impl``: the replay
    attention (``sparse_attention.SPARSE_IMPLS``)."""
    from trainer.learner.attention import SDPACoreAttention
    from trainer.learner.replay_cache import shared_replay_masks

    def with_impl(fn):
        def call():
            SDPACoreAttention.sparse_impl = impl
            fn()
        return call

    @with_impl
    def fwd():
        with shared_replay_masks():
            trainer.compute_logprobs(samples, sparse=sparse)

    @with_impl
    def train():
        with shared_replay_masks():
            trainer.train_step(samples, loss_fn, sparse=sparse)

    @with_impl
    def rollout():
        with shared_replay_masks():
            trainer.compute_logprobs(samples, sparse=sparse)
            trainer.train_step(samples, loss_fn, sparse=sparse)

    return {"recompute": fwd, "update": train, "rollout": rollout}


def time_phases(calls: dict, args, tokens: int) -> dict:
    """Tokens/s of every mode and phase after the warm-up rollouts, the sparse/dense time
    ratios, and the graphs compiled in the warm-up and (should be none) while timing."""
    for fns in calls.values():
        for _ in range(args.warmup):
            fns["rollout"]()
    out = {"compiled_graphs_warmup": compiled_graphs()}  # FlexAttention: grad and no_grad
    for mode, fns in calls.items():
        for phase, fn in fns.items():
            seconds = time_repeats(fn, args.steps, args.repeats)
            out[f"{mode}_{phase}_tokens_per_s"] = round(tokens / statistics.median(seconds))
            out[f"{mode}_{phase}_step_s"] = spread(seconds)  # min / median / max of --repeats
    out["compiled_graphs_timed"] = compiled_graphs() - out["compiled_graphs_warmup"]
    for mode in calls:
        prefix = "" if mode == "sparse" else f"{mode.removeprefix('sparse_')}_"
        for phase in calls["dense"] if mode != "dense" else ():
            out[f"{prefix}{phase}_time_ratio"] = round(out[f"dense_{phase}_tokens_per_s"]
                                                       / out[f"{mode}_{phase}_tokens_per_s"], 3)
    return out


def shape_arch(shape: str):
    """The attention shape of ``--shape`` (what the records and tiles need), without a model."""
    from types import SimpleNamespace

    c = SHAPES[shape]
    return SimpleNamespace(num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"],
                           num_query_groups=c["num_key_value_heads"],
                           num_attention_heads=c["num_attention_heads"])


def run(args) -> dict:
    from checkpoint_tools import cpu_megatron

    if args.tiles_only:
        arch = shape_arch(args.shape)
        samples = make_samples(args, arch)
        return dict(shape=args.shape, tokens_per_step=sum(s.length for s in samples),
                    budget=args.budget, response_len=args.response_len,
                    tile_work=tile_work(samples, arch, args.max_tokens_per_gpu))

    trainer = build_trainer(args)
    arch = trainer.arch
    samples = make_samples(args, arch)
    tokens = sum(s.length for s in samples)
    loss_fn = nll_loss(samples)
    result = dict(shape=args.shape, tokens_per_step=tokens, budget=args.budget,
                  response_len=args.response_len, seqs_per_step=args.seqs_per_step,
                  mask_build_ms=mask_build_ms(samples, arch, args.max_tokens_per_gpu,
                                              cpu_megatron.default_device()))
    impls = args.sparse_impl or (["flex"] if torch.cuda.is_available() else ["auto"])
    result["tile_work"] = tile_work(samples, arch, args.max_tokens_per_gpu)
    calls = {"dense": phases(trainer, samples, loss_fn, False)}
    for i, impl in enumerate(impls):
        calls["sparse" if i == 0 else f"sparse_{impl}"] = phases(trainer, samples, loss_fn, True,
                                                                 impl)
    result.update(sparse_impls=impls, **time_phases(calls, args, tokens))
    if args.profile:  # dense too: the families' baseline
        result["profile"] = {f"{mode}_{phase}": profile_phase(f"{mode} {phase}", calls[mode][phase])
                             for mode in calls for phase in ("recompute", "update")}
    cpu_megatron.teardown()
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    for k, v in result.items():
        print(f"{k:32s} {v}")
    return emit(result, args.json)


if __name__ == "__main__":
    main()
