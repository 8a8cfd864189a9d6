"""The quickstart: a tiny model learns step-by-step addition with GRPO on R-KV sparse rollouts.

    python -m trainer.quickstart [--workdir runs/quickstart] [--num-rollout 24]

1. A tiny Qwen2.5-style model (random init, tokenizer trained on the spot) is saved in HF format.
2. A short supervised warm-up teaches it the answer *format* on a few demonstrations, so that
   some of its samples are right and GRPO has a signal (a random policy never is).
3. GRPO runs end to end through the real stack: the in-process sglang-kvc engine samples with
   R-KV compression (the KV budget is smaller than every response, so every sample is
   compressed several times), the math grader scores the boxed answers, Megatron recomputes
   π_old densely, the sparse-rollout correction reweights/rejects tokens, and the updated
   weights go back to the engine after every rollout.
The task: ``a+b`` for one-digit ``a``, ``b``, answered by counting up from ``a`` one step per
line and boxing the result, which makes responses long enough that compression really acts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from dataset.arith_tool import arith_tool_rows
from dataset.lookup_tool import lookup_tool_rows

from .startup.flag_checks import COMPRESS_ALGORITHMS, check_quickstart_values
from .startup import interrupt

PROMPT = "<|im_start|>user\nadd {a} {b}<|im_end|>\n<|im_start|>assistant\n"


def response_text(a: int, b: int) -> str:
    steps = " ".join(f"{a + i}" for i in range(1, b + 1))
    return f"{a} {steps} \\boxed{{{a + b}}}<|im_end|>"


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(3, 9)
        rows.append({"prompt": PROMPT.format(a=a, b=b), "label": str(a + b)})
    return rows


def build_model(out: Path, seed: int) -> Path:
    from checkpoint_tools.tiny_models import make_tiny_model

    overrides = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return make_tiny_model("qwen2.5", out, seed=seed, overrides=overrides)


def warm_up(model_dir: Path, steps: int, seed: int, lr: float = 3e-3) -> float:
    """Supervised steps on demonstrations (response tokens only); returns the final loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from checkpoint_tools.hf_io import fix_safetensors_modes

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed + 1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        pairs = [(rng.randint(1, 9), rng.randint(3, 9)) for _ in range(32)]
        prompts = [tok(PROMPT.format(a=a, b=b), add_special_tokens=False)["input_ids"]
                   for a, b in pairs]
        answers = [tok(response_text(a, b), add_special_tokens=False)["input_ids"]
                   for a, b in pairs]
        width = max(len(p) + len(r) for p, r in zip(prompts, answers))
        ids = torch.full((len(pairs), width), tok.pad_token_id)
        labels = torch.full_like(ids, -100)
        for i, (p, r) in enumerate(zip(prompts, answers)):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir)
    fix_safetensors_modes(model_dir)  # save_pretrained leaves them 0600
    return float(loss)


# The real-model task: one-digit sums and products, reasoned out in a sentence or two. Measured on
# SmolLM2-135M-Instruct (temperature 1, 192 samples): mean reward 0.14, ~88 response tokens, so
# GRPO has signal from the start and R-KV (budget 40) really evicts.
# the multi-turn tool task's trainer flags: its environment and three model turns at most
TOOL_FLAGS = ("--env-path", "recipes.tool_use:ArithToolEnv", "--max-turns", "3")
# lookup-tool: a turn of lookups, a calculator call, the answer; five turns leave room for
# lookups one a turn
LOOKUP_FLAGS = ("--env-path", "recipes.lookup_tool:LookupToolEnv", "--max-turns", "5")
SMOLLM2_QUESTION = "What is {a} {op} {b}? Think step by step, then give the final answer as a number."


def smollm2_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+*")
        rows.append({"prompt": [{"role": "user", "content": SMOLLM2_QUESTION.format(a=a, op=op, b=b)}],
                     "label": str(a + b if op == "+" else a * b)})
    return rows


def chain_rows(n: int, seed: int) -> list[dict]:
    """Running sums (``dataset.long_arith``, 25 steps): every step's line is checked
    (``--rm-type chain``), so answers stay ~270 tokens long while GRPO trains."""
    from dataset.long_arith import chain_rows as rows

    return rows(n, seed)


def long_chain_rows(n: int, seed: int) -> list[dict]:
    from dataset.long_arith import long_chain_rows as rows

    return rows(n, seed)


def long_chain_demos(n: int, seed: int) -> list[dict]:
    from dataset.long_arith import long_chain_demos as rows

    return rows(n, seed)


@dataclasses.dataclass(frozen=True)
class SmolTask:
    """A task the quickstart trains on: a ``--task`` of ``--model smollm2``, or ``TINY_TASK``."""

    rows: Callable[[int, int], list[dict]]  # (n, seed) -> rows
    rm_type: str
    max_len: int  # --rollout-max-response-len
    sample_tokens: int  # KV pool slots a dense sample may hold: prompt + response
    kv_budget: int  # --sglang-compress-max-prompt unless --kv-budget
    warmup_steps: int  # supervised steps of 4 worked answers before GRPO (trainer.warmup)
    demos: Callable[[int, int], list[dict]] | None = None  # the warm-up's rows, when not ``rows``
    flags: tuple[str, ...] = ()  # the task's own trainer flags (a multi-turn environment)
    keep_prompt: bool = False  # compressed: never evict the prompt (--sglang-compress-keep-prompt)


# ``arith`` is the short task: its reward checks the last number, and GRPO shortened answers from
# ~100 to ~12 tokens. ``chain`` needs 255-285 response tokens for full credit; the model writes its
# format at temperature 1 only after a short warm-up (sample reward 0.00 before, 0.30 after 12 steps).
# Measurements: docs/long_task.md.
# ``chain100``: 100 numbers, ~1,170 tokens for full credit, warmed up on 50-step answers so that
# GRPO has the rest of the chain to learn (dataset.long_arith); 320-token prompts, 1,280 to answer.
SMOLLM2_TASKS = {"arith": SmolTask(smollm2_rows, "gsm8k", 160, 220, 40, 0),
                 "arith-tool": SmolTask(functools.partial(arith_tool_rows, style="chat"), "arithmetic",
                                        256, 480, 128, 12, flags=TOOL_FLAGS, keep_prompt=True),
                 # the prices hidden (a lookup tool), orders of 2-4 items; warmed up on one- and two-item
                 # orders at other prices (the calls' format, not the answers): dataset.lookup_tool
                 "lookup-tool": SmolTask(functools.partial(lookup_tool_rows, style="chat"), "arithmetic",
                                         320, 512, 128, 12, functools.partial(lookup_tool_rows, demos=True),
                                         flags=LOOKUP_FLAGS, keep_prompt=True),
                 "chain": SmolTask(chain_rows, "chain", 400, 600, 128, 12),
                 "chain100": SmolTask(long_chain_rows, "chain", 1280, 1600, 128, 12, long_chain_demos)}
# The tiny model's own task (``make_rows``: count up, box the sum): 40 response tokens, a pool of
# 128 slots a sample, R-KV budget 20, 60 warm-up steps (tiny_setup).
TINY_TASK = SmolTask(make_rows, "math", 40, 128, 20, 60)
# ``arith-tool`` on the tiny model (one-digit numbers): a calculator call (~70 tokens), its
# response (~40), the boxed value (~8); warmed up on 110 x 8 worked episodes (the format is
# learnt in ~30 steps, copying the numbers into the call after ~100: 16 of 16 sampled calls right
# after 160, which would leave GRPO little to do). R-KV's budget of 96 spans the episode's
# context (engine sessions), the prompt kept. Measured on two machines (seed 0, 2 busy cores
# each): 347-363 s, reward 0.04-0.06 over the first 5 rollouts -> 0.13-0.19 over the last 5
# (docs/environments.md names the machines).
TINY_TOOL_TASK = SmolTask(functools.partial(arith_tool_rows, style="tiny"), "arithmetic", 160, 192,
                          96, 110, flags=TOOL_FLAGS, keep_prompt=True)
# ``lookup-tool`` on the tiny model: one or two items, one-digit prices; warmed up on one-item
# orders (the CPU check that the task runs end to end, not a measure of learning)
TINY_LOOKUP_TASK = SmolTask(functools.partial(lookup_tool_rows, style="tiny"), "arithmetic", 192, 256, 96, 110,
                            functools.partial(lookup_tool_rows, style="tiny", demos=True),
                            flags=LOOKUP_FLAGS, keep_prompt=True)
TINY_TASKS = {"arith-tool": TINY_TOOL_TASK, "lookup-tool": TINY_LOOKUP_TASK}
# R-KV's buffer N (--sglang-compress-divide-length) and observation window per --model: short
# against each model's answers, so that a sample is compressed several times.
COMPRESS_SHAPE = {"tiny": (4, 4), "smollm2": (16, 8)}


def task_of(model: str, task: str) -> SmolTask:
    """The task a ``--model`` / ``--task`` pair trains on (the tiny model has only its own)."""
    if model == "tiny":
        return TINY_TASKS.get(task, TINY_TASK)
    return SMOLLM2_TASKS[task]


def smollm2_warm_up(model_dir: Path, work: Path, task: SmolTask, steps: int, seed: int,
                    batch: int = 4, lr: float = 5e-5) -> Path:
    """``steps`` supervised steps on the task's worked answers (rows of another seed than the
    training data's), on the GPU when there is one, saved to ``work/model-warm`` in fp32."""
    from .warmup import warm_up as sft

    import torch

    demos = (task.demos or task.rows)(batch * steps, seed + 10_000)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on an H200's CPU: 37 s a SmolLM2 step
    losses = sft(model_dir, demos, work / "model-warm", steps, batch=batch, lr=lr, seed=seed, device=device)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the engine and the trainer start next, in this process
    print(f"[quickstart] warm-up: {steps} supervised steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return work / "model-warm"


def tiny_setup(work: Path, args) -> tuple[Path, list[dict], list[str]]:
    """A tiny model warmed up on the counting format; GRPO with R-KV budget ``--kv-budget``."""
    task = task_of("tiny", args.task)
    warmed = work / "model" if task is TINY_TASK else work / "model-warm"
    model_dir = warmed if _kept(warmed, args, _steps(args, task)) else _tiny_model(work, task, args)
    flags = ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128",
             "--rollout-max-response-len", str(task.max_len), "--rm-type", task.rm_type,
             *micro_batch_flags(4096), "--sglang-max-total-tokens", str(128 * task.sample_tokens),
             "--sglang-max-running-requests", "128", *task.flags]
    # R-KV keeps 20 tokens (+ a 4-token buffer): responses run 10-40 tokens, and the average
    # sample is compressed ~4 times, so the sampler really is the sparse policy.
    if args.compress_algorithm != "none":
        flags += compress_flags("tiny", args.compress_algorithm, _budget(args, task), task.keep_prompt)
    return model_dir, task.rows(2000, args.seed), flags


def _tiny_model(work: Path, task, args) -> Path:
    """The tiny model built and warmed up: on the counting format, or (a multi-turn task) on
    worked episodes through trainer.warmup with the observations masked."""
    model_dir = build_model(work / "model", args.seed)
    steps = _steps(args, task)
    if task is not TINY_TASK:
        warmed = smollm2_warm_up(model_dir, work, task, steps, args.seed, batch=8, lr=3e-3)
        return _mark_warm(warmed, args, steps)
    loss = warm_up(model_dir, steps, args.seed)
    print(f"[quickstart] warm-up: {steps} supervised steps, final loss {loss:.3f}")
    return _mark_warm(model_dir, args, steps)


def _steps(args, task: SmolTask) -> int:
    return task.warmup_steps if args.warmup_steps is None else args.warmup_steps


def _budget(args, task: SmolTask) -> int:
    return task.kv_budget if args.kv_budget is None else args.kv_budget


def micro_batch_flags(cpu_tokens: int) -> list[str]:
    """The trainer's micro-batch: on a GPU its size from free memory (the default); on a CPU
    ``cpu_tokens``."""
    import torch

    if torch.cuda.is_available():
        return []
    # reason: on a CPU the default sizes from the host's free RAM, which other processes share
    return ["--max-tokens-per-gpu", str(cpu_tokens)]


# Written beside a warmed-up model once its warm-up is complete: the warm-up is saved, so a
# run interrupted before its first checkpoint (every 10 rollouts) resumes after it (issue 70).
WARM_MARK = "quickstart-warmup.json"


def _warm_record(args, steps: int) -> dict:
    """What a warm-up depends on: another model, task, seed or step count warms up anew."""
    return {"model": args.model, "model_dir": args.model_dir, "task": args.task, "seed": args.seed,
            "warmup_steps": steps}


def _mark_warm(model_dir: Path, args, steps: int) -> Path:
    (model_dir / WARM_MARK).write_text(json.dumps(_warm_record(args, steps)) + "\n")
    return model_dir


def _warm_done(model_dir: Path, args, steps: int) -> bool:
    try:
        return json.loads((model_dir / WARM_MARK).read_text()) == _warm_record(args, steps)
    except (OSError, ValueError):  # none (interrupted mid warm-up, or an older run), or torn
        return False


def _kept(model_dir: Path, args, steps: int) -> bool:
    """The model built and warmed up by an earlier run in the workdir is still there, so neither
    is redone: its warm-up completed (the mark), or a complete checkpoint (``args.resume_from``)
    was written after it."""
    resuming = args.resume_from is not None and (model_dir / "config.json").is_file()
    if not (resuming or _warm_done(model_dir, args, steps)):
        return False
    where = (f"resuming from checkpoint iteration {args.resume_from}" if resuming else
             "resuming after the warm-up (no checkpoint yet)")
    print(f"[quickstart] {where}: the warmed-up model in {model_dir} is kept (no warm-up)")
    return True


def compress_flags(model: str, algorithm: str, budget: int, keep_prompt: bool = False) -> list[str]:
    """The trainer's engine flags of ``algorithm`` at ``budget`` (``COMPRESS_SHAPE``'s N and window)."""
    divide, window = COMPRESS_SHAPE[model]
    return ["--sglang-compress-algorithm", algorithm, "--sglang-compress-max-prompt", str(budget),
            "--sglang-compress-divide-length", str(divide), "--sglang-compress-max-window", str(window),
            *(["--sglang-compress-keep-prompt"] if keep_prompt else [])]


def smollm2_setup(work: Path, args) -> tuple[Path, list[dict], list[str]]:
    """The real SmolLM2-135M-Instruct (scripts/get-smollm2.sh), its chat template, the ``--task``'s
    rows and reward (arith: gsm8k-style, the last number; chain: every step, after a warm-up);
    4 prompts x 8 samples per rollout on a CPU (~1 min each on 2 cores for arith), 64 x 8 on a GPU."""
    import subprocess

    import torch

    model_dir = Path(args.model_dir or Path(__file__).resolve().parents[1] / "models" /
                     "SmolLM2-135M-Instruct")
    if not (model_dir / "model.safetensors").is_file():
        script = Path(__file__).resolve().parents[1] / "scripts" / "get-smollm2.sh"
        subprocess.run(["bash", str(script), str(model_dir)], check=True)
    task = SMOLLM2_TASKS[args.task]
    steps = _steps(args, task)
    if steps and not _kept(work / "model-warm", args, steps):
        model_dir = _mark_warm(smollm2_warm_up(model_dir, work, task, steps, args.seed), args, steps)
    elif steps:
        model_dir = work / "model-warm"
    prompts = 64 if torch.cuda.is_available() else 4
    flags = ["--rollout-batch-size", str(prompts), "--n-samples-per-prompt", "8",
             "--global-batch-size", str(prompts * 8), "--rollout-max-response-len", str(task.max_len),
             "--rm-type", task.rm_type,
             # micro-batch logits are tokens x 49,152 vocab: 4k tokens keep a CPU run in memory
             *micro_batch_flags(4096),
             "--sglang-max-total-tokens", str(prompts * 8 * task.sample_tokens + 4096),
             "--sglang-max-running-requests", str(prompts * 8), *task.flags]
    # The engine computes in the trainer's dtype (fp32 on a CPU, bf16 on a GPU). The chain
    # warm-up is saved in fp32, and an engine left at "auto" ran it in fp32 on a GPU while the
    # trainer held bf16: the first rollout and step-0 eval measured weights nobody trains.
    flags += ["--sglang-dtype", "bfloat16" if torch.cuda.is_available() else "float32"]
    # arith: R-KV keeps 40 tokens (+ a 16-token buffer) of ~140 (52 prompt + ~88 response): the
    # peak KV per sample is at most 56 slots, under half of dense's. chain: 128 (+ 16) of ~460.
    if args.compress_algorithm != "none":
        flags += compress_flags("smollm2", args.compress_algorithm, _budget(args, task),
                                task.keep_prompt)
    return model_dir, task.rows(4000, args.seed), flags


def train_argv(model_dir: Path, data: Path, work: Path, rollouts: int, lr: float, seed: int,
               flags: list[str], save: bool = True) -> list[str]:
    """``trainer.train``'s flags of a quickstart run: logs (and, with ``save``, the final
    checkpoint) under ``work``, a cosine schedule over ``rollouts``, no KL, the setup's ``flags``."""
    return ["--hf-checkpoint", str(model_dir), "--prompt-data", str(data),
            # a checkpoint every 10 rollouts, the last one kept: Ctrl-C, then the same command, resumes
            *(["--save", str(work / "ckpt"), "--save-interval", "10", "--save-retain", "1"]
              if save else []), "--log-dir", str(work / "logs"),
            "--num-rollout", str(rollouts), "--rollout-temperature", "1.0", "--lr", str(lr),
            "--min-lr", str(lr / 10), "--lr-decay-style", "cosine",
            "--lr-decay-iters", str(rollouts), "--adam-beta2", "0.99", "--weight-decay", "0.0",
            "--kl-loss-coef", "0", "--seed", str(seed), *flags]


SETUPS = {"tiny": tiny_setup, "smollm2": smollm2_setup}
DEFAULT_LR = {"tiny": 3e-4, "smollm2": 2e-6}


def check_trainer_flags(extra: list[str], prog: str = "python -m trainer.quickstart") -> None:
    """The trainer's flags given to the quickstart, checked before any warm-up (a typo used to
    take 20-50 s to report). The model and data do not exist yet: stand-ins take their place,
    so only the flags themselves are judged."""
    import tempfile
    import warnings

    from .arguments import parse_args

    # Megatron's import-time notes about missing TE/Apex would bury a one-line error.
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Path(d, "config.json").write_text("{}")
        Path(d, "train.jsonl").write_text("")
        parse_args(["--hf-checkpoint", d, "--prompt-data", str(Path(d, "train.jsonl")), *extra],
                   prog=prog)


def build_parser(prog: str):
    from sglang_kvc import OneLineParser  # one-line errors, no abbreviations

    p = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0],
                      epilog="Any other flag goes to trainer.train (python -m trainer.train --help). "
                             "Interrupted, the same command resumes from the last checkpoint.")
    p.add_argument("--model", choices=sorted(SETUPS), default="tiny",
                   help="tiny: a small random model warmed up on addition (default); smollm2: the "
                        "real SmolLM2-135M-Instruct on one-digit arithmetic (or --task chain)")
    p.add_argument("--model-dir", default=None, help="smollm2: where the HF checkpoint is (built "
                   "there by scripts/get-smollm2.sh when missing; default models/SmolLM2-135M-Instruct)")
    p.add_argument("--workdir", default=None, help="default: runs/quickstart[-smollm2]")
    p.add_argument("--num-rollout", type=int, default=None, help="default: 40 tiny, 4 smollm2 on "
                   "a CPU, 30 smollm2 on a GPU")
    p.add_argument("--task", choices=sorted(SMOLLM2_TASKS), default="arith",
                   help="smollm2: arith (one-digit arithmetic, default) or chain (25-step running "
                        "sums, every step checked: answers stay long); arith-tool (either model): "
                        "a * b + c with a calculator tool, multi-turn; lookup-tool (either model): "
                        "an order's total from prices only a lookup tool shows (docs/environments.md)")
    p.add_argument("--warmup-steps", type=int, default=None, help="supervised steps before GRPO "
                   "(default: 60 tiny, 110 tiny arith-tool and lookup-tool, 12 smollm2 chain, arith-tool and "
                   "lookup-tool, 0 smollm2 arith)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compress-algorithm", default="rkv", help=", ".join(COMPRESS_ALGORITHMS[:-1])
                   + " or none (a value outside these is refused before any model work)")
    p.add_argument("--kv-budget", type=int, default=None, help="--sglang-compress-max-prompt "
                   "(default: 20 tiny, 40 smollm2 arith, 128 smollm2 chain)")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-4 tiny, 2e-6 smollm2")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    interrupt.set_command(["python", "-m", "trainer.quickstart", *argv])
    if threading.current_thread() is threading.main_thread():
        interrupt.install()  # the warm-up too, not only the trainer
    prog = interrupt.prog("python -m trainer.quickstart")
    p = build_parser(prog)
    args, extra = p.parse_known_args(argv)  # anything else goes to trainer.train
    if args.model == "tiny" and args.task not in ("arith", *TINY_TASKS):
        p.error(f"--task {args.task} is for --model smollm2 (the tiny model learns its own counting "
                "task, arith-tool or lookup-tool)")
    if args.model_dir and not Path(args.model_dir).is_dir() and args.model != "smollm2":
        p.error(f"--model-dir {args.model_dir}: only --model smollm2 reads a model directory")
    check_quickstart_values(p, args, window=COMPRESS_SHAPE[args.model][1])  # before any model work
    check_trainer_flags(extra, prog)
    work = Path(args.workdir or ("runs/quickstart" if args.model == "tiny" else "runs/quickstart-smollm2")
                + ("" if args.task == "arith" else f"-{args.task}"))
    try:
        return _run(args, extra, work)
    except interrupt.Interrupted:  # before the trainer started (it reports its own)
        interrupt.say(interrupt.report(work / "ckpt", interrupt.command([])))
        return interrupt.exit_code()


def _run(args, extra: list[str], work: Path) -> int:
    """Warm-up, then GRPO through ``trainer.train``, then the reward's first-vs-last line."""
    import torch

    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # `is None`, not `or`: an explicit value (--lr 0) is the user's, never the default
    lr = DEFAULT_LR[args.model] if args.lr is None else args.lr
    rollouts = args.num_rollout if args.num_rollout is not None else (
        40 if args.model == "tiny" else 30 if torch.cuda.is_available() else 4)
    args.resume_from = completed_iteration(work)
    if args.resume_from is not None and args.resume_from >= rollouts:
        print(complete_message(work, args.resume_from, rollouts))
        return 0
    model_dir, rows, flags = SETUPS[args.model](work, args)
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    from .train import main as train_main

    rc = train_main(train_argv(model_dir, data, work, rollouts, lr, args.seed, flags) + extra)
    if rc:
        return rc
    print(f"[quickstart] {reward_summary(work)}; {time.perf_counter() - start:.0f}s in all; "
          f"logs and plots in {work / 'logs'}")
    return 0


def completed_iteration(work: Path) -> int | None:
    """The last complete checkpoint's iteration (= rollouts done) in ``work``, or None."""
    from checkpoint_tools.torch_dist import read_tracker

    tracker = read_tracker(work / "ckpt")
    return int(tracker) if tracker and tracker.isdigit() else None


def reward_summary(work: Path) -> str:
    """The mean reward of the first and the last (up to) 5 rollouts of ``work``'s metrics."""
    rows = [json.loads(line) for line in open(work / "logs" / "metrics.jsonl")]
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]  # eval-only rows have none
    k = max(1, min(5, len(rewards) // 2))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    return f"reward mean, first {k} rollouts {first:.3f} -> last {k} {last:.3f} ({last - first:+.3f})"


def complete_message(work: Path, done: int, rollouts: int) -> str:
    """A rerun of a finished quickstart: nothing to train; what it got, and how to run anew."""
    try:
        result = reward_summary(work)
    except (OSError, ValueError):  # metrics removed or torn: the checkpoint still says it is done
        result = "its metrics are gone"
    return (f"[quickstart] the run in {work} is complete ({done} of {rollouts} rollouts): "
            f"{result}; logs and plots in {work / 'logs'}. To run anew, remove {work} or give "
            f"another --workdir.")


if __name__ == "__main__":
    interrupt.exit(main())
