"""A run of the correction grid: its config and name (``GridRun``: ``dense`` or
``ALGORITHM:BUDGET:PRESET[:REPLAY][+VARIANT...]`` and seed; ``parse_config``, ``run_from_name``,
``discover``), its held-out prompts (``eval_file``), its metrics (``read_rows``, ``RunResult``,
``collect``) and its KV pool against dense of the same seed (``dense_by_seed``, ``pool_*``).

The grid's CLI (``correction_grid.py``), its paired report (``paired.py``) and its waves
(``waves.py``, ``supervisor.py``) all read runs through here, so none of them imports another
to learn what a run is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path

REPLAYS = ("sparse-recompute", "train-sparse-policy")  # trainer flags of eviction replay


# A variant's name: no '-', ':' or '+', so a run folder's name parses back (discover)
VARIANT_NAME = re.compile(r"^[a-z0-9_]+$")


@dataclasses.dataclass(frozen=True)
class GridRun:
    algorithm: str  # "none" for dense
    budget: int | None
    preset: str | None  # --mis-preset
    seed: int
    replay: str | None = None  # one of REPLAYS
    variants: tuple[str, ...] = ()  # names of --variant flag sets, added last

    @property
    def config(self) -> str:
        base = "dense" if self.algorithm == "none" else \
            f"{self.algorithm}:{self.budget}:{self.preset}" + (f":{self.replay}" if self.replay else "")
        return "+".join((base, *self.variants))

    @property
    def name(self) -> str:
        return f"{self.config.replace(':', '-')}-s{self.seed}"

    def flags(self) -> list[str]:
        if self.algorithm == "none":
            return ["--compress-algorithm", "none"]
        return ["--compress-algorithm", self.algorithm, "--kv-budget", str(self.budget),
                "--mis-preset", self.preset] + ([f"--{self.replay}"] if self.replay else [])


def parse_config(text: str, seed: int) -> GridRun:
    base, *variants = text.split("+")
    bad = [v for v in variants if not VARIANT_NAME.match(v)]
    if bad:
        raise ValueError(f"config {text!r}: variant name {bad[0]!r}: use a-z, 0-9 and _ only")
    if base == "dense":
        return GridRun("none", None, None, seed, variants=tuple(variants))
    parts = base.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit() or (len(parts) == 4 and parts[3] not in REPLAYS):
        raise ValueError(f"config {text!r}: expected 'dense' or ALGORITHM:BUDGET:PRESET[:REPLAY], "
                         f"then +VARIANT... (e.g. rkv:128:sparse_rl, rkv:128:disabled:train-sparse-policy, "
                         f"rkv:192:sparse_rl+adaptive; REPLAY one of {', '.join(REPLAYS)})")
    return GridRun(parts[0], int(parts[1]), parts[2], seed, parts[3] if len(parts) == 4 else None,
                   tuple(variants))


def parse_variants(specs: list[str]) -> dict[str, list[str]]:
    """``--variant NAME=FLAGS`` values as name -> flag list (a name given twice is an error)."""
    out = {}
    for spec in specs:
        name, sep, flags = spec.partition("=")
        if not sep or not VARIANT_NAME.match(name) or name in out:
            raise ValueError(f"{spec!r}: expected NAME=FLAGS, NAME new and of a-z, 0-9 and _ "
                             f"(e.g. adaptive='--adaptive-budget-max 512')")
        out[name] = shlex.split(flags)
    return out


def eval_file(out: Path, model: str, task: str, prompts: int, seed: int) -> Path:
    """Held-out prompts of the task (a seed no training or warm-up row uses)."""
    from trainer.quickstart import task_of

    path = out / f"eval-{task}.jsonl"
    rows = task_of(model, task).rows(prompts, seed)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(folder: Path) -> list[dict]:
    """The run's metrics merged per step (eval rows and rollout rows of one step are separate):
    from its run folder, or from its exported ``<folder>.jsonl`` (``waves.export_run``)."""
    path = folder / "logs" / "metrics.jsonl"
    if not path.is_file():
        path = folder.parent / f"{folder.name}.jsonl"
    if not path.is_file():
        return []
    from trainer.tracking import read_metrics

    return read_metrics(path)


@dataclasses.dataclass
class RunResult:
    run: GridRun
    rows: list[dict]

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in self.rows if isinstance(r.get(key), (int, float))]

    def eval_key(self, task: str, temperature: str, dense: bool, metric: str) -> str:
        # a dense run evaluates only as trained, which is dense
        suffix = ("" if temperature == "0" else f"_t{temperature}") + \
                 ("_dense" if dense and self.run.algorithm != "none" else "")
        return f"eval/{task}{suffix}/{metric}"

    def final(self, key: str) -> float:
        points = self.series(key)
        return points[-1][1] if points else math.nan

    def mean(self, key: str) -> float:
        values = [v for _, v in self.series(key)]
        return sum(values) / len(values) if values else math.nan


def collect(runs: list[GridRun], out: Path) -> list[RunResult]:
    return [RunResult(run, read_rows(out / run.name)) for run in runs]


def dense_by_seed(results: list[RunResult]) -> dict[int, RunResult]:
    """Each seed's plain dense run: the reference of the pool fractions (a dense run with a
    variant is a config like any other)."""
    return {r.run.seed: r for r in results if r.run.algorithm == "none" and not r.run.variants}


def pool_series(result: RunResult, dense: RunResult | None) -> list[tuple[int, float]]:
    """Per rollout: the run's KV pool peak over dense's at the same rollout (same seed)."""
    theirs = dict(dense.series("kv_pool_peak_used")) if dense else {}
    return [(s, v / theirs[s]) for s, v in result.series("kv_pool_peak_used") if theirs.get(s)]


def pool_fraction(result: RunResult, dense: RunResult | None) -> float:
    """The largest of ``pool_series`` over the run."""
    return max((v for _, v in pool_series(result, dense)), default=math.nan)


def pool_provision(result: RunResult, dense: RunResult | None) -> float:
    """The run's largest pool peak over dense's largest: the memory a user must provision
    (dense's peak grows as its answers lengthen, so early rollouts dominate ``pool_fraction``)."""
    ours, theirs = result.series("kv_pool_peak_used"), dense.series("kv_pool_peak_used") if dense else []
    if not ours or not theirs:
        return math.nan
    return max(v for _, v in ours) / max(v for _, v in theirs)


def run_from_name(name: str) -> GridRun:
    """The run a folder or JSONL is named after (``<config>-s<seed>``, ':' written '-')."""
    config, _, seed = name.rpartition("-s")
    base, *variants = config.split("+")
    if base == "dense":
        return GridRun("none", None, None, int(seed), variants=tuple(variants))
    algorithm, budget, rest = base.split("-", 2)
    replay = next((r for r in REPLAYS if rest.endswith("-" + r)), None)
    preset = rest[: -len(replay) - 1] if replay else rest
    return GridRun(algorithm, int(budget), preset, int(seed), replay, tuple(variants))


RUN_NAME = re.compile(r"^(dense|[a-z0-9_]+-\d+-[a-z0-9_-]+)(\+[a-z0-9_]+)*-s\d+$")


def discover(folder: Path) -> list[GridRun]:
    """The runs under ``folder``, from their names (``<config>-s<seed>``): run folders holding
    ``logs/metrics.jsonl``, or a grid's exported ``<config>-s<seed>.jsonl`` files."""
    names = {p.name for p in folder.iterdir() if (p / "logs" / "metrics.jsonl").is_file()}
    names |= {p.stem for p in folder.glob("*.jsonl") if RUN_NAME.match(p.stem)}
    return [run_from_name(name) for name in sorted(names)]
