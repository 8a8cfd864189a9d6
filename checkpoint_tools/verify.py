"""Check a torch_dist checkpoint against its HF model: Megatron logits vs transformers logits.

    python -m checkpoint_tools.verify --hf-checkpoint DIR --load CKPT [--tp 2] [--pp 2]

Spawns ``tp * pp`` gloo ranks (CPU) that build the Megatron GPT model at that parallelism, load
the checkpoint, run a forward pass over varied prompts (pipeline stages hand activations on with
point-to-point sends) and compare the full-vocab logits with the HF model's. The same routine
backs the conversion tests, so what users run is what CI checks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import verify_args

if __name__ == "__main__":  # --help and flag errors before torch and Megatron load
    verify_args(description=__doc__.split("\n\n")[0])

import torch  # noqa: E402

from . import cpu_megatron  # noqa: E402
from .model_config import CheckpointError, ModelArch, load_arch  # noqa: E402

DEFAULT_PROMPTS = (
    "What is 3 + 4?",
    "Let's think step by step and output the final answer within \\boxed{}.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "1 2 3",
)


def encode_prompts(hf_dir: str | Path, prompts=DEFAULT_PROMPTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and the boolean mask of real (non-pad) positions."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    rows = [tok(p)["input_ids"] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        valid[i, : len(r)] = True
    return ids, valid


@torch.no_grad()
def hf_logits(hf_dir: str | Path, input_ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    return model(input_ids).logits


@torch.no_grad()
def _pipeline_logits(model, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Forward through this rank's stage; the last stage returns gathered logits, others None."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        from .megatron_model import forward_logits

        return forward_logits(model, input_ids)
    b, s = input_ids.shape
    hidden_shape = (s, b, model.config.hidden_size)
    if not ps.is_pipeline_first_stage():
        received = torch.empty(hidden_shape, dtype=model.config.params_dtype)
        torch.distributed.recv(received, src=ps.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(received)
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
    out = model(input_ids=input_ids, position_ids=position_ids,
                attention_mask=cpu_megatron.causal_attention_mask(s))
    if not ps.is_pipeline_last_stage():
        torch.distributed.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
        return None
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    return gather_from_tensor_model_parallel_region(out)


def _load_on_rank(rank, world, port, hf_dir, load, tp, pp):
    from .megatron_model import build_gpt_model, load_torch_dist
    from .model_config import load_arch

    cpu_megatron.init_distributed(rank, world, master_port=port, backend="gloo")
    cpu_megatron.init_model_parallel(tp=tp, pp=pp)
    arch = load_arch(hf_dir)
    model = build_gpt_model(arch, dtype=torch.float32).eval()
    load_torch_dist(model, load)
    return arch, model


def _logits_task(rank, world, port, hf_dir, load, tp, pp, input_ids):
    from megatron.core import parallel_state as ps

    arch, model = _load_on_rank(rank, world, port, hf_dir, load, tp, pp)
    logits = _pipeline_logits(model, input_ids)
    if logits is not None and ps.get_tensor_model_parallel_rank() == 0:
        return logits[..., : arch.vocab_size].clone()
    return None


def _resave_task(rank, world, port, hf_dir, load, tp, pp, save_dir):
    """Load at TP x PP and save again with Megatron's own sharded state dict (as training does)."""
    from megatron.core import dist_checkpointing

    from .torch_dist import read_common, resolve_checkpoint_dir, write_tracker

    _, model = _load_on_rank(rank, world, port, hf_dir, load, tp, pp)
    common = read_common(resolve_checkpoint_dir(load))
    out = Path(save_dir) / "iter_0000001"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save({"model": model.sharded_state_dict(), "args": common["args"],
                             "checkpoint_version": 3.0, "iteration": 1}, str(out))
    if rank == 0:
        write_tracker(save_dir, 1)
    return str(out) if rank == 0 else None


def megatron_logits(hf_dir: str | Path, load: str | Path, input_ids: torch.Tensor,
                    tp: int = 1, pp: int = 1) -> torch.Tensor:
    """Logits of the Megatron model at TP x PP (one spawned gloo process per rank)."""
    results = cpu_megatron.run_on_ranks(_logits_task, tp * pp, str(hf_dir), str(load), tp, pp,
                                        input_ids)
    return next(r for r in results if r is not None)


def resave_with_megatron(hf_dir: str | Path, load: str | Path, save_dir: str | Path,
                         tp: int = 1, pp: int = 1) -> Path:
    """Round-trip a checkpoint through a Megatron model at TP x PP; return the new iteration dir."""
    results = cpu_megatron.run_on_ranks(_resave_task, tp * pp, str(hf_dir), str(load), tp, pp,
                                        str(save_dir))
    return Path(results[0])


def compare_with_hf(hf_dir: str | Path, load: str | Path, tp: int = 1, pp: int = 1,
                    prompts=DEFAULT_PROMPTS) -> float:
    """Max |logit difference| between Megatron (TP x PP) and HF over the real prompt positions."""
    ids, valid = encode_prompts(hf_dir, prompts)
    reference = hf_logits(hf_dir, ids)
    ours = megatron_logits(hf_dir, load, ids, tp=tp, pp=pp)
    return (ours - reference).abs()[valid].max().item()


def check_parallelism(arch: ModelArch, tp: int, pp: int) -> None:
    """CheckpointError, naming the flag, for a TP x PP this model cannot be split into: Megatron
    gives each TP rank whole attention heads and whole KV groups, each PP stage whole layers."""
    if tp < 1 or pp < 1:
        raise CheckpointError(f"--tp {tp} --pp {pp}: both must be >= 1")
    heads, groups = arch.num_attention_heads, arch.num_query_groups
    if heads % tp or groups % tp:
        fits = [t for t in range(1, groups + 1) if groups % t == 0]
        raise CheckpointError(f"--tp {tp}: this model has {heads} attention heads and {groups} KV "
                              f"heads, which {tp} ranks cannot share evenly; use --tp "
                              f"{' or '.join(map(str, fits))}")
    if arch.num_layers % pp:
        raise CheckpointError(f"--pp {pp}: this model's {arch.num_layers} layers do not split "
                              f"evenly into {pp} pipeline stages")


def _checked_inputs(args) -> None:
    check_parallelism(load_arch(args.hf_checkpoint), args.tp, args.pp)
    if not Path(args.load).exists():
        raise CheckpointError(f"--load {args.load}: no such checkpoint (a torch_dist root or "
                              f"iteration dir, as scripts/hf2megatron.sh writes)")


def main(argv=None) -> int:
    args = verify_args(argv, description=__doc__.split("\n\n")[0])
    try:  # before any rank is spawned: one line, not a traceback from every rank
        _checked_inputs(args)
    except CheckpointError as e:
        print(f"verify: error: {e}", file=sys.stderr)
        return 2
    diff = compare_with_hf(args.hf_checkpoint, args.load, tp=args.tp, pp=args.pp)
    ok = diff < args.tolerance
    print(f"max |logit diff| Megatron(TP={args.tp}, PP={args.pp}) vs HF: {diff:.3e} "
          f"({'OK' if ok else 'FAIL'}, tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
