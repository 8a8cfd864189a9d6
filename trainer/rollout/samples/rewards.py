"""Rewards of generated responses (slime's ``--rm-type`` / ``--custom-rm-path``).

    model = RewardModel(RewardConfig(rm_type="math"))
    model.score([RewardInput(prompt, response, label="5")])   # -> [1.0] or [0.0]
    model.close()                                              # stops the grader processes

Built-in types (a sample's ``metadata["rm_type"]`` overrides ``--rm-type`` for that sample, as
in slime):

Every answer extraction and exact check lives in ``evaluation.grader`` (``final_boxed``,
``tasks``): this module only routes samples to them and runs custom functions.

* ``math``: the last ``\\boxed{}`` of the response graded against the label by
  ``evaluation.grader`` (1.0 / 0.0). No complete final box scores 0 (a response cut inside its
  box gave no answer). Grading runs in worker processes (:class:`evaluation.grader.GraderPool`)
  with a hard per-item timeout (``--reward-timeout``): sympy can hang on adversarial answers and
  a training step must not. A timed-out item scores 0.
* ``gsm8k``: the number after the last ``####``, else the last number of the response, equal to
  the label's number (the label may itself be a GSM8K solution ending in ``#### N``). Compared
  exactly as decimals (``72.0`` = ``72``; ``1,000`` = ``1000``).
* ``countdown``: the label is ``{"target": T, "numbers": [...]}`` (a dict or its JSON string, as
  ``dataset.synthetic`` writes it); the answer (last box, else the generic answer extraction) must
  use every number exactly once with ``+ - * /`` and equal the target. Checked by
  ``evaluation.grader.tasks.check_countdown``, an AST walk over numbers and the four operators
  only (no ``eval``).
* ``arithmetic``: the label is an exact number (``dataset.synthetic`` arithmetic tasks); the
  extracted answer must equal it exactly.
* ``chain``: running sums (``dataset.long_arith``, label ``{"start": S, "steps": [...]}``); the
  fraction of steps written as ``total + number = new total`` with all three numbers right, in
  order (``evaluation.grader.tasks.score_chain``), so only a full-length answer scores 1.

The cheap types run in-process: they are bounded (length caps, integer literals only) and
cannot hang.

Custom rewards (``--custom-rm-path pkg.module:func``, ``pkg.module.func`` or ``file.py:func``)
replace the built-in types. The function takes one :class:`RewardInput` and returns a number,
or -- when batched -- a ``list[RewardInput]`` and returns a list of numbers. It is batched when
it has a truthy ``batched`` attribute (see :func:`batched_reward`) or its first parameter is
annotated as a list/sequence. It may be ``async def``: coroutines of one batch run concurrently
in an event loop (a private thread's loop when the caller already runs one).
"""

from __future__ import annotations

import argparse
import asyncio
import collections.abc
import concurrent.futures
import dataclasses
import inspect
import math
import os
import re
import typing
from typing import Callable

from .plugins import load_dotted

RM_TYPES = ("math", "gsm8k", "countdown", "arithmetic", "chain")
DEFAULT_MAX_WORKERS = 8  # grader processes when --reward-workers is not given (each imports sympy)


@dataclasses.dataclass
class RewardInput:
    """One sample to score. ``label`` is the dataset's ``--label-key`` value, verbatim."""

    prompt: str
    response: str
    label: str | list | dict | None = None
    metadata: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RewardConfig:
    rm_type: str = "math"
    custom_rm_path: str | None = None
    timeout: float = 5.0  # seconds per graded item (math)
    workers: int | None = None  # grader processes; None = min(8, CPU count)


# --------------------------------------------------------------------------- custom functions

def batched_reward(fn: Callable) -> Callable:
    """Mark a custom reward function as taking ``list[RewardInput]`` and returning ``list[float]``."""
    fn.batched = True
    return fn


def load_custom_reward(path: str) -> Callable:
    """Import ``pkg.module:func``, ``pkg.module.func`` or ``path/to/file.py:func``.

    Errors name ``--custom-rm-path`` so a bad flag fails at start-up, not at the first rollout.
    """
    return load_dotted(path, "--custom-rm-path")


def _is_batched(fn: Callable) -> bool:
    flag = getattr(fn, "batched", None)
    if flag is not None:
        return bool(flag)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    ann = params[0].annotation
    if ann is inspect.Parameter.empty:
        return False
    if isinstance(ann, str):  # `from __future__ import annotations` in the user's module
        return re.match(r"(typing\.)?(list|List|Sequence|collections\.abc\.Sequence)\b", ann.strip()) is not None
    origin = typing.get_origin(ann) or ann
    return isinstance(origin, type) and issubclass(origin, (list, collections.abc.Sequence)) \
        and origin is not str


def _run_coroutine(coro):
    """Run ``coro`` to completion from sync code, even when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _gather(values: list):
    async def resolve(v):
        return await v if inspect.isawaitable(v) else v

    return await asyncio.gather(*(resolve(v) for v in values))


def _as_reward(value, where: str) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where} returned {value!r}; a reward must be a number") from None
    if not math.isfinite(out):
        raise ValueError(f"{where} returned {out}; a reward must be finite")
    return out


# --------------------------------------------------------------------------- the model

class RewardModel:
    """Scores batches of :class:`RewardInput`. Owns a grader process pool (math): call
    :meth:`close` or use it as a context manager."""

    def __init__(self, config: RewardConfig | None = None, *, grade_options=None):
        """``grade_options``: an ``evaluation.grader.GradeOptions`` for the math grader (default:
        the grader's defaults)."""
        self.config = config = config or RewardConfig()
        self._grade_options = grade_options
        if config.custom_rm_path is None and config.rm_type not in RM_TYPES:
            raise ValueError(f"--rm-type {config.rm_type!r} is unknown; choose one of {', '.join(RM_TYPES)} "
                             f"or give --custom-rm-path")
        if not config.timeout > 0:
            raise ValueError(f"--reward-timeout must be positive, got {config.timeout}")
        if config.workers is not None and config.workers < 1:
            raise ValueError(f"--reward-workers must be at least 1, got {config.workers}")
        self._custom = load_custom_reward(config.custom_rm_path) if config.custom_rm_path else None
        self._custom_batched = self._custom is not None and _is_batched(self._custom)
        self._pool = None
        # counters for logging: of the last score() call, and over the model's life
        self.last_stats: dict[str, float] = {}
        self.total_timeouts = 0

    # -- public

    def score(self, batch: list[RewardInput]) -> list[float]:
        """One reward per input, in order."""
        batch = list(batch)
        self.last_stats = {"reward_timeouts": 0}
        if not batch:
            return []
        if self._custom is not None:
            return self._score_custom(batch)
        rewards: list[float | None] = [None] * len(batch)
        by_type: dict[str, list[int]] = {}
        for i, item in enumerate(batch):
            rm_type = (item.metadata or {}).get("rm_type", self.config.rm_type)
            if rm_type not in RM_TYPES:
                raise ValueError(f"sample {i}: metadata rm_type {rm_type!r} is unknown; "
                                 f"choose one of {', '.join(RM_TYPES)}")
            by_type.setdefault(rm_type, []).append(i)
        for rm_type, indices in by_type.items():
            for i in indices:
                if batch[i].label is None:
                    raise ValueError(f"sample {i} has no label, which rm_type {rm_type!r} needs "
                                     f"(check --label-key)")
            if rm_type == "math":
                values = self._score_math([batch[i] for i in indices])
            else:
                fn = _task_scorer(rm_type)
                values = [fn(batch[i].response or "", batch[i].label) for i in indices]
            for i, v in zip(indices, values):
                rewards[i] = v
        return rewards  # type: ignore[return-value]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- internals

    def _score_math(self, items: list[RewardInput]) -> list[float]:
        from evaluation.grader import GraderPool, final_boxed, math_gold

        answers = [final_boxed(item.response or "") for item in items]
        todo = [k for k, a in enumerate(answers) if a]  # no (or an empty) box: 0 without grading
        out = [0.0] * len(items)
        if not todo:
            return out
        if self._pool is None:
            workers = self.config.workers or min(DEFAULT_MAX_WORKERS, os.cpu_count() or 1)
            extra = {} if self._grade_options is None else {"options": self._grade_options}
            self._pool = GraderPool(workers=workers, timeout=self.config.timeout, **extra)
        results = self._pool.map([(answers[k], math_gold(items[k].label)) for k in todo])
        timeouts = 0
        for k, result in zip(todo, results):
            out[k] = 1.0 if result.correct else 0.0
            timeouts += bool(result.timed_out)
        self.last_stats["reward_timeouts"] += timeouts
        self.total_timeouts += timeouts
        return out

    def _score_custom(self, batch: list[RewardInput]) -> list[float]:
        fn, path = self._custom, self.config.custom_rm_path
        where = f"custom reward --custom-rm-path {path!r}"
        try:
            if self._custom_batched:
                values = fn(batch)
                if inspect.isawaitable(values):
                    values = _run_coroutine(_gather([values]))[0]
            else:
                values = [fn(item) for item in batch]
                if any(inspect.isawaitable(v) for v in values):
                    values = _run_coroutine(_gather(values))
        except Exception as exc:
            raise RuntimeError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(values, (list, tuple)) or len(values) != len(batch):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else repr(type(values).__name__)
            raise TypeError(f"{where} (batched) must return a list of {len(batch)} rewards, got {got}")
        return [_as_reward(v, f"{where} on sample {i}") for i, v in enumerate(values)]


def _task_scorer(rm_type: str) -> Callable:
    """The grader of a task reward (the graders import sympy: loaded when a rollout is scored,
    not with the flags)."""
    from evaluation.grader.tasks import score_arithmetic, score_chain, score_countdown, score_gsm8k

    return {"gsm8k": score_gsm8k, "countdown": score_countdown, "arithmetic": score_arithmetic,
            "chain": score_chain}[rm_type]


# --------------------------------------------------------------------------- flags

def add_reward_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``--rm-type``, ``--custom-rm-path``, ``--reward-timeout``, ``--reward-workers``."""
    g = parser.add_argument_group("rollout: rewards")
    g.add_argument("--rm-type", choices=RM_TYPES, default=RewardConfig.rm_type,
                   help="built-in reward: math (last \\boxed{} graded by evaluation.grader), gsm8k "
                        "(number after ####), countdown (label {target, numbers}), arithmetic (exact "
                        "number), chain (running sums, fraction of steps right); a sample's metadata rm_type "
                        "overrides it (default: math)")
    g.add_argument("--custom-rm-path", default=None,
                   help="custom reward function 'pkg.module:func', 'pkg.module.func' or 'file.py:func': "
                        "(RewardInput) -> float, or list[RewardInput] -> list[float] when its first "
                        "parameter is annotated as a list; sync or async; replaces --rm-type")
    g.add_argument("--reward-timeout", type=float, default=5.0,
                   help="seconds each math answer may take to grade; a timeout scores 0 (default: 5)")
    g.add_argument("--reward-scaling", type=float, default=1.0,
                   help="training rewards become (reward + --reward-bias) x this (AReaL's "
                        "reward_scaling); eval scores and the logged reward_mean stay raw")
    g.add_argument("--reward-bias", type=float, default=0.0, help="see --reward-scaling")
    g.add_argument("--reward-workers", type=int, default=None,
                   help=f"grader worker processes (default: min({DEFAULT_MAX_WORKERS}, CPU count))")
    return parser


def reward_config_from_args(args: argparse.Namespace) -> RewardConfig:
    return RewardConfig(rm_type=args.rm_type, custom_rm_path=args.custom_rm_path,
                        timeout=args.reward_timeout, workers=args.reward_workers)
