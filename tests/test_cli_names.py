"""One program-name style in ``--help`` and in errors: every command-line tool of the packages
is run as ``python -m package.module`` and names itself so (argparse's default is the file's
name: ``tiny_models.py``, ``grade.py``, ``run_eval.py`` beside ``python -m ...``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("checkpoint_tools", "dataset", "evaluation", "recipes", "trainer")
# converters name themselves as their wrapper scripts do (scripts/hf2megatron.sh, ...)
CONVERTERS = {"checkpoint_tools/cli.py"}


def _parsers(path: Path):
    """``(line, prog or None)`` of each ``argparse.ArgumentParser(...)`` call in ``path``
    (``add_help=False`` probes, which print no help, left out)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("add_help"), ast.Constant) and kw["add_help"].value is False:
                continue
            prog = kw.get("prog")
            yield node.lineno, prog.value if isinstance(prog, ast.Constant) else prog


def _runs_a_module(prog: str) -> bool:
    """``python -m a.b`` where ``a/b.py`` exists (the module the user types; a parser built
    elsewhere, as trainer/ray/options.py's for trainer.ray_job, names the entry point)."""
    words = prog.split()
    return (len(words) == 3 and words[:2] == ["python", "-m"]
            and (ROOT / (words[2].replace(".", "/") + ".py")).is_file())


def test_every_tool_names_itself_python_dash_m():
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if str(rel) in CONVERTERS:
                continue
            for line, prog in _parsers(path):
                if prog is None:
                    wrong.append(f"{rel}:{line}: no prog (argparse would print {path.name})")
                elif isinstance(prog, str) and not _runs_a_module(prog):
                    wrong.append(f"{rel}:{line}: prog={prog!r}")
    assert not wrong, wrong


def test_help_says_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "evaluation.grade", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("usage: python -m evaluation.grade "), out
