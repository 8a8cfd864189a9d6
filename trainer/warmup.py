"""Supervised format warm-up: a few steps on a task's worked answers before GRPO.

    python -m dataset.long_arith --n 48 --seed 10000 --out runs/chain25-demos.jsonl
    python -m trainer.warmup --model-dir models/SmolLM2-135M-Instruct --data runs/chain25-demos.jsonl \
        --steps 12 --out models/SmolLM2-135M-Instruct-chain25w12

GRPO learns only from prompts whose samples differ in reward. SmolLM2-135M-Instruct sampled at
temperature 1 never wrote the 25 lines of the ``chain`` task (reward 0.000 on 64 samples: it
drifts into prose after 2-3 lines); 12 steps of 4 worked answers put it at 0.30 with every
prompt carrying signal (docs/long_task.md). Rows need ``prompt`` (messages, rendered with the
model's chat template, or a string used verbatim) and ``solution`` (the answer text), or a
multi-turn episode's ``solution_turns`` (with ``observations`` between them, as
``dataset.arith_tool`` writes); the loss is on the answer's tokens and the end-of-turn token.
Use rows of a seed the training data does not use. It trains on the GPU when there is one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads in the functions that use it: --help comes before
    import torch


def example_ids(tok, row: dict) -> tuple[list[int], list[int], list[int] | None]:
    """``(prompt ids, answer ids, answer mask)`` of one worked example; the answer ends the turn.
    A multi-turn example (``solution_turns`` with ``observations`` between them) is rendered as
    the multi-turn rollout renders it (``rollout/multiturn/chat.py``), and only the model's turns
    are trained (mask 0 on the observations)."""
    prompt = row["prompt"]
    if isinstance(prompt, list):
        prompt = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    if "solution_turns" not in row:
        return encode(prompt), encode(row["solution"] + tok.eos_token), None
    from .rollout.multiturn.chat import observation_format

    fmt, ids, mask = observation_format(tok), [], []
    turns, observations = row["solution_turns"], row.get("observations", [])
    for k, turn in enumerate(turns):
        turn_ids = encode(turn + tok.eos_token)
        ids, mask = ids + turn_ids, mask + [1] * len(turn_ids)
        if k < len(turns) - 1:
            obs = encode(fmt.render(turn + tok.eos_token, observations[k]))
            ids, mask = ids + obs, mask + [0] * len(obs)
    return encode(prompt), ids, mask


def batch_tensors(pairs: list[tuple], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``labels`` (-100 everywhere but the answers, and where an
    answer's optional third element, its mask, is 0)."""
    import torch

    width = max(len(p) + len(r) for p, r, *_ in pairs)
    ids = torch.full((len(pairs), width), pad_id)
    labels = torch.full_like(ids, -100)
    for i, (p, r, *mask) in enumerate(pairs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        target = torch.tensor(r)
        if mask and mask[0] is not None:
            target = torch.where(torch.tensor(mask[0]).bool(), target, torch.tensor(-100))
        labels[i, len(p): len(p) + len(r)] = target
    return ids, labels


def save(model, tok, source: Path, out: Path, dtype: torch.dtype) -> None:
    """The checkpoint in ``dtype``, with the tokenizer and the source's chat/generation configs."""
    from checkpoint_tools.hf_io import fix_safetensors_modes

    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    fix_safetensors_modes(out)  # save_pretrained leaves them 0600
    tok.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)


def _progress(step: int, steps: int, loss: float, seconds: float) -> None:
    """One progress line, rewritten in place on a terminal; nothing otherwise (a log file got
    one line a step: 110 for the tiny arith-tool warm-up). The caller prints the outcome."""
    if sys.stdout.isatty():
        end = "\n" if step == steps else ""
        print(f"\r[warmup] step {step}/{steps}: loss {loss:.3f} ({seconds:.0f}s)", end=end, flush=True)


def warm_up(model_dir: str | Path, rows: list[dict], out: str | Path, steps: int, batch: int = 4,
            lr: float = 5e-5, seed: int = 0, dtype: torch.dtype | None = None,
            device: str = "cpu") -> list[float]:
    """``steps`` AdamW steps of ``batch`` rows each (in order, then again), trained in fp32 on
    ``device`` and saved in ``dtype`` (None: fp32) to ``out``. Returns the losses.

    fp32 by default: the steps are small against bf16's resolution, and a bf16 copy of the
    12-step SmolLM2 warm-up sampled reward 0.165 where the fp32 one sampled 0.3 (docs/long_task.md).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    source, out = Path(model_dir), Path(out)
    tok = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    losses, begin = [], time.perf_counter()
    for step in range(steps):
        chunk = [rows[(step * batch + i) % len(rows)] for i in range(batch)]
        ids, labels = batch_tensors([example_ids(tok, r) for r in chunk], pad)
        loss = model(input_ids=ids.to(device), labels=labels.to(device)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        _progress(step + 1, steps, losses[-1], time.perf_counter() - begin)
    save(model.cpu(), tok, source, out, dtype or torch.float32)
    return losses


def is_worked_example(row) -> bool:
    """A single-turn answer (``solution``) or a multi-turn episode (``solution_turns``)."""
    return isinstance(row, dict) and "prompt" in row and ("solution" in row or "solution_turns" in row)


def main(argv=None) -> int:
    from dataset.formats import iter_rows

    p = argparse.ArgumentParser(prog="python -m trainer.warmup",
                                allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data", required=True, help="rows with prompt and solution, or solution_turns "
                   "(.jsonl / .parquet)")
    p.add_argument("--out", required=True, help="where the warmed-up HF checkpoint goes")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0, help="torch seed (rows are used in file order)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="of the saved checkpoint (default float32: see warm_up)")
    p.add_argument("--device", default=None, help="where it trains (default: cuda when there is a GPU, else cpu)")
    a = p.parse_args(argv)
    rows = [row for _, row in iter_rows(Path(a.data))]
    missing = [i for i, r in enumerate(rows) if not is_worked_example(r)]
    if not rows or missing:
        p.error(f"{a.data}: every row needs 'prompt' and 'solution' (or 'solution_turns') "
                f"(rows {missing[:5]} do not)")
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    losses = warm_up(a.model_dir, rows, a.out, a.steps, a.batch, a.lr, a.seed, getattr(torch, a.dtype), device)
    print(f"[warmup] {a.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
