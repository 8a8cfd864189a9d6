"""Every command shown in README.md and docs/training.md runs as written.

Each line of their fenced ```bash blocks (continuations joined) is checked as cheaply as it can be
while still exercising the line itself:

- `scripts/run-*.sh` lines run exactly as written with DRY_RUN=1 (PREFLIGHT=0, SAVE_DIR in a temporary
  folder): they must print the trainer command, whose flags the trainer must know; when `../shared`
  sits beside the checkout, the documented data paths must resolve to its files.
- lines that ask for `--help` run as written;
- anything else (the trainer under torchrun, the server, eval.sh, the converters, the quickstart,
  `ray start`, ...) has every `--flag` checked against its target's `--help` (a wrapper script's
  target is the `python -m` module it execs).

A line no rule covers fails, so a new command in the docs needs a rule here. Links between these
docs are checked too (file and #anchor).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/training.md"]
SHARED_DATA = ROOT.parent / "shared" / "data"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")
# values for the shell variables the docs leave to the reader (several-node examples)
PLACEHOLDERS = {"NODE_RANK": "0", "HEAD": "127.0.0.1", "HEAD_IP": "127.0.0.1"}


def bash_commands(doc: str) -> list[tuple[int, str]]:
    """(line number, command) for every command line in the doc's ```bash blocks."""
    out, block, pending, start = [], False, "", 0
    for number, line in enumerate((ROOT / doc).read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            block = stripped == "```bash" if not block else False
            continue
        if not block:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        command, pending = (pending + stripped).strip(), ""
        if command and not command.startswith("#"):
            out.append((start, command))
    return out


CASES = [(doc, number, command) for doc in DOCS for number, command in bash_commands(doc)]


def python_env() -> dict:
    env = dict(os.environ)
    path = [str(ROOT), str(ROOT / "sglang-kvc")]
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


@functools.lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    proc = subprocess.run(list(argv) + ["--help"], cwd=ROOT, env=python_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(argv)} --help failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


def module_flags(module: str) -> set[str]:
    return set(FLAG.findall(help_text(sys.executable, "-m", module)))


def doc_flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--") and len(a) > 2]


def assert_flags(args: list[str], known: set[str], what: str) -> None:
    unknown = [f for f in doc_flags(args) if f not in known]
    assert not unknown, f"{what} does not take {unknown} (not in its --help)"


def wrapped_module(script: Path) -> str:
    """The `python -m <module>` a wrapper script execs."""
    for line in script.read_text().splitlines():
        found = re.search(r"^\s*exec .* -m ([\w.]+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"{script}: no `exec ... -m module` line")


def split_command(command: str) -> tuple[dict, str, list[str]]:
    tokens = shlex.split(command, comments=True)
    env = {}
    while tokens and ASSIGNMENT.match(tokens[0]):
        name, value = tokens.pop(0).split("=", 1)
        env[name] = value
    assert tokens, command
    program, args = tokens[0], tokens[1:]
    if program == "bash" and args and args[0].endswith(".sh"):
        program, args = args[0], args[1:]
    return env, program, args


def check_run_script(command: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MODEL_DIR", "DATA_DIR", "EVAL_DIR", "EVAL_SETS", "NUM_GPUS", "TP", "PP", "REF_LOAD",
                        "LOG_DIR", "RAY", "ROLLOUT_GPUS", "NUM_NODES", "RAY_ARGS", "TORCHRUN_ARGS")}
    env.update(PLACEHOLDERS, DRY_RUN="1", PREFLIGHT="0", SAVE_DIR=str(tmp_path / "save"),
               PYTHONPATH=python_env()["PYTHONPATH"])
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    known = module_flags("trainer.train")
    if "trainer.ray_job" in argv:
        known = known | module_flags("trainer.ray_job")
        args = argv[argv.index("trainer.ray_job") + 1:]
    else:
        args = argv[argv.index("trainer.train") + 1:]
    assert_flags(args, known, "the printed trainer command")
    if SHARED_DATA.is_dir():  # the documented defaults must find the shipped data
        for line in proc.stderr.splitlines():
            assert not ("training data" in line or "eval data" in line), f"{command}\n{line}"


def check_module(module: str, args: list[str], command: str) -> None:
    if "--help" in args or "-h" in args:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=python_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
        return
    if module.startswith("benchmarks.") and args and not args[0].startswith("-"):
        known = set(FLAG.findall(help_text(sys.executable, "-m", module, args[0])))  # a subcommand's
        assert_flags(args[1:], known, f"python -m {module} {args[0]}")
        return
    known = module_flags(module)
    if module == "trainer.ray_job":  # every other flag goes to the trainer
        known = known | module_flags("trainer.train")
    assert_flags(args, known, f"python -m {module}")


def check_pytest_args(args: list[str]) -> None:
    markers = (ROOT / "pyproject.toml").read_text()
    i = 0
    while i < len(args):
        if args[i] == "-m":
            for word in re.findall(r"[A-Za-z_]+", args[i + 1]):
                assert word in ("not", "and", "or") or f'"{word}:' in markers, f"no pytest marker {word!r}"
            i += 2
            continue
        if not args[i].startswith("-"):
            assert (ROOT / args[i].split("::")[0]).exists(), args[i]
        i += 1


@pytest.mark.parametrize("doc,number,command", CASES, ids=[f"{d}:{n}" for d, n, _ in CASES])
def test_command(doc, number, command, tmp_path):
    env, program, args = split_command(command)
    if program.startswith("./scripts/run-") or program.startswith("scripts/run-"):
        assert (ROOT / program).is_file() and os.access(ROOT / program, os.X_OK), program
        check_run_script(command, tmp_path)
    elif program in ("python", "python3") and args[:1] == ["-m"]:
        check_module(args[1], args[2:], command)
    elif program == "torchrun":
        i = args.index("-m")
        assert_flags(args[:i], module_flags("torch.distributed.run"), "torchrun")
        check_module(args[i + 1], args[i + 2:], command)
    elif program == "ray":
        ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
        if not Path(ray).exists():
            pytest.skip("the ray CLI is not installed")
        assert_flags(args[1:], set(FLAG.findall(help_text(ray, args[0]))), f"ray {args[0]}")
    elif program in ("./scripts/test.sh", "scripts/test.sh"):
        check_pytest_args(args)
    elif program in ("./scripts/get-smollm2.sh", "./scripts/setup.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / program)]).returncode == 0
        assert not doc_flags(args), f"{program} takes no flags"
    elif program.endswith(".sh"):
        script = ROOT / program
        assert script.is_file(), program
        module = wrapped_module(script)
        check_module(module, args, command)
        if module == "evaluation.run_eval" and SHARED_DATA.is_dir() and "--benchmarks" in args:
            for name in args[args.index("--benchmarks") + 1].split(","):
                assert (SHARED_DATA / "eval" / name / "test.jsonl").is_file(), name
    else:
        pytest.fail(f"{doc}:{number}: no rule checks `{program}`; add one to {Path(__file__).name}")
    for name in env:  # a documented variable must be one the scripts read
        if program.endswith(".sh"):
            text = (ROOT / program).read_text() + (ROOT / "scripts/lib/common.sh").read_text()
            assert name in text or name in PLACEHOLDERS, f"{program} does not read {name}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS)
def test_links(doc):
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{doc}: link to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"{doc}: link to {target}: no such heading"


def test_front_page_shape():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 125, "README.md is the newcomer's page: keep it short"
    training = (ROOT / "docs/training.md").read_text()
    layouts = training.split("## Two GPUs: which layout\n")[1].split("\n## ")[0]
    for layout in ("colocated DP = 2", "disaggregated", "TP = 2"):  # each measured, and why
        assert layout in layouts
