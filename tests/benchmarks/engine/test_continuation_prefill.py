"""benchmarks/engine/continuation_prefill.py on the tiny model (CPU): each row pairs one
continuation prefill step with one fresh one of the same rows, whose sizes are computed by hand
(a continuation computes its new tokens plus the token turn 1 sampled, over the turn-1 prompt it
holds), once per cuDNN setting; bad flags are CLI errors naming them. Timings only checked to
be there."""

from __future__ import annotations

import pytest

from benchmarks.engine.continuation_prefill import main, parse_args


def test_each_context_pairs_a_continuation_with_a_fresh_prefill(tmp_path):
    out = main(["--tiny", "--contexts", "16,48", "--rows", "2", "--new", "4", "--repeats", "1",
                "--cudnn-sdp", "off,on", "--json", str(tmp_path / "c.json")])
    assert (tmp_path / "c.json").is_file()
    assert [(r["cudnn_sdp"], r["context"]) for r in out["rows"]] == [
        ("off", 16), ("off", 48), ("on", 16), ("on", 48)]
    for row in out["rows"]:
        assert (row["rows"], row["continuations"], row["new_tokens"]) == (2, 2, 2 * (4 + 1))
        assert row["held_max"] == row["context"]
        assert row["continuation_launch_ms"] > 0 and row["fresh_launch_ms"] > 0
    fresh = [r["fresh"] for r in out["runs"]]
    assert all((f["rows"], f["continuations"], f["tokens"]) == (2, 0, 2 * 4) for f in fresh)


@pytest.mark.parametrize("flags, named", [(["--contexts", "a,b"], "--contexts"),
                                          (["--rows", "0"], "--rows"),
                                          (["--cudnn-sdp", "yes"], "--cudnn-sdp")])
def test_bad_flags_name_themselves(flags, named, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--tiny", *flags])
    assert named in capsys.readouterr().err
