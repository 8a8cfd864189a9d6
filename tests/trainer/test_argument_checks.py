"""The trainer's flags before any work: no abbreviations, one-line errors naming the flag or
file, and a one-line warning for flags with no effect in their combination."""

from __future__ import annotations

import json

import pytest

from trainer.arguments import parse_args


@pytest.fixture()
def base(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "label": "2"}) + "\n")
    return ["--hf-checkpoint", str(tmp_path / "hf"), "--prompt-data", str(data)]


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # the message, not 200 lines of usage
    return err[0]


def test_abbreviated_flag_is_refused(base, capsys):
    line = _error(base + ["--max-stalenes", "1"], capsys)
    assert "unrecognized arguments: --max-stalenes 1" in line
    assert parse_args(base + ["--max-staleness", "1"]).max_staleness == 1


@pytest.mark.parametrize("flag", ["--prompt-data", "--eval-prompt-data"])
def test_missing_data_file(base, capsys, tmp_path, flag):
    missing = str(tmp_path / "nope.jsonl")
    argv = base + (["--prompt-data", missing] if flag == "--prompt-data"
                   else ["--eval-prompt-data", "t", missing + "@[0:4]"])
    assert f"{flag} {missing}: file not found" in _error(argv, capsys)


def test_missing_checkpoint(base, capsys):
    line = _error(base + ["--hf-checkpoint", "/nonexistent"], capsys)
    assert "--hf-checkpoint /nonexistent: no config.json there" in line


def test_deleted_replay_path_is_refused_naming_the_flag_and_its_replacement(base, capsys):
    line = _error(base + ["--sparse-attention", "gather"], capsys)
    assert "argument --sparse-attention: 'gather' is no longer a choice" in line
    assert "use flex" in line and "(choose from auto, mask, flex)" in line
    assert parse_args(base + ["--sparse-attention", "flex"]).sparse_attention == "flex"
    assert "invalid choice: 'gatherr'" in _error(base + ["--sparse-attention", "gatherr"], capsys)


@pytest.mark.parametrize("extra,warned", [
    (["--max-staleness", "0", "--partial-rollout"], "--partial-rollout with --max-staleness 0"),
    (["--sparse-recompute"], "--sparse-recompute without --sglang-compress-algorithm"),
    (["--train-sparse-policy", "--sglang-compress-algorithm", "none"],
     "--train-sparse-policy without --sglang-compress-algorithm"),
    (["--sparse-recompute", "--sglang-compress-algorithm", "rkv"], None),
    (["--max-staleness", "1", "--partial-rollout"], None),
])
def test_flags_without_effect_warn_in_one_line(base, capsys, extra, warned):
    parse_args(base + extra)
    err = capsys.readouterr().err.strip().splitlines()
    if warned is None:
        assert err == []
    else:
        assert len(err) == 1 and "warning" in err[0] and warned in err[0], err


def test_quickstart_checks_trainer_flags_before_warming_up(tmp_path):
    import subprocess
    import sys

    work = tmp_path / "qs"
    r = subprocess.run([sys.executable, "-m", "trainer.quickstart", "--workdir", str(work),
                        "--max-stalenes", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "python -m trainer.quickstart: error: unrecognized arguments: --max-stalenes 1 "
        "(--help lists the flags)"]
    assert not work.exists()  # nothing built, nothing warmed up
