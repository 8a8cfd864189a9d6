"""The package layout the READMEs promise: imports between top-level packages go one way, the
trainer's sides do not reach back into the loop, and answer extraction has one home."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sglang_kvc": ROOT / "sglang-kvc" / "sglang_kvc", "checkpoint_tools": ROOT / "checkpoint_tools",
            "dataset": ROOT / "dataset", "evaluation": ROOT / "evaluation", "trainer": ROOT / "trainer",
            "recipes": ROOT / "recipes"}
# README "Architecture": what each package may import of the others
ALLOWED = {"sglang_kvc": set(), "checkpoint_tools": set(), "dataset": set(),
           "evaluation": {"dataset"},
           "trainer": {"sglang_kvc", "checkpoint_tools", "evaluation", "dataset"},
           "recipes": {"sglang_kvc", "checkpoint_tools", "evaluation", "dataset", "trainer"}}


def _imports(path: Path, package: str) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against ``package``)."""
    rel = path.relative_to(PACKAGES[package]).with_suffix("")
    here = [package, *rel.parts[:-1]]  # the package a relative import starts from
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            names.add(".".join([*base, node.module] if node.module else base))
    return names


def _modules(package: str):
    return sorted(PACKAGES[package].rglob("*.py"))


def test_packages_import_one_way():
    for package, allowed in ALLOWED.items():
        for path in _modules(package):
            for name in _imports(path, package):
                top = name.split(".")[0]
                if top in PACKAGES and top != package:
                    assert top in allowed, f"{path.relative_to(ROOT)} imports {name}"


def test_trainer_sides_do_not_import_the_loop():
    loop = {"trainer.train", "trainer.arguments", "trainer.quickstart"}
    for side in ("rollout", "learner", "algorithms"):
        for path in (PACKAGES["trainer"] / side).rglob("*.py"):
            hits = {n for n in _imports(path, "trainer") if n in loop}
            assert not hits, f"{path.relative_to(ROOT)} imports {hits}"
    for path in (PACKAGES["trainer"] / "algorithms").rglob("*.py"):
        bad = {n for n in _imports(path, "trainer") if n.startswith(("megatron", "trainer.learner",
                                                                     "trainer.rollout"))}
        assert not bad, f"{path.relative_to(ROOT)}: algorithms are pure tensor maths, imports {bad}"


def test_trainer_top_level_stays_small():
    top = [p.name for p in PACKAGES["trainer"].glob("*.py")]
    assert len(top) <= 8, top


def test_one_home_for_answer_extraction():
    """``last_boxed``/``match_brace``/countdown checks are defined only in evaluation.grader."""
    defined: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and ("boxed" in node.name or "countdown" in
                                                          node.name or node.name == "match_brace"):
                    if not node.name.endswith(("_question", "_task")):  # generators, not checkers
                        defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    for name, where in defined.items():
        assert all(w.startswith("evaluation/grader/") for w in where), (name, where)
    assert {"last_boxed", "final_boxed", "match_brace", "check_countdown", "score_countdown"} <= set(defined)
