"""trainer.warmup: the supervised format warm-up before GRPO (a tiny model, CPU)."""

import json

import pytest
import torch

from dataset.long_arith import ChainConfig, chain_rows
from trainer.warmup import batch_tensors, main, warm_up


def test_labels_cover_only_the_answers():
    ids, labels = batch_tensors([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])], pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert labels.tolist() == [[-100, -100, -100, 4, 5], [-100, 7, 8, 9, -100]]


def test_warm_up_learns_the_answers_and_saves_fp32(tiny_model_factory, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_factory("qwen2.5")
    rows = chain_rows(2, seed=0, config=ChainConfig(steps=3))
    out = tmp_path / "warm"
    losses = warm_up(model_dir, rows, out, steps=8, batch=2, lr=3e-3)  # the same two rows, 8 times
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.float32 and (out / "tokenizer_config.json").is_file()


def test_cli_refuses_rows_without_solution(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "1"}) + "\n")
    with pytest.raises(SystemExit):
        main(["--model-dir", "unused", "--data", str(data), "--out", str(tmp_path / "o")])


class _Out:
    """A stdout that says whether it is a terminal and keeps what is written."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_warm_up_progress_is_one_line(monkeypatch):
    """Issue 70: the tiny arith-tool warm-up printed 110 lines, one a step. On a terminal the
    steps rewrite one line (a newline only after the last); in a log, nothing (the caller's
    one summary line says how it went)."""
    from trainer import warmup

    for tty in (True, False):
        out = _Out(tty)
        monkeypatch.setattr("sys.stdout", out)
        for step in range(1, 111):
            warmup._progress(step, 110, 1.0 / step, float(step))
        monkeypatch.undo()
        if tty:
            assert out.text.count("\n") == 1 and out.text.endswith("\n")
            assert out.text.count("\r") == 110
            assert out.text.rsplit("\r", 1)[-1] == "[warmup] step 110/110: loss 0.009 (110s)\n"
        else:
            assert out.text == ""


def test_cli_warms_up_on_its_own_multi_turn_rows(tiny_model_factory, tmp_path, capsys):
    """The rows ``dataset.arith_tool`` writes (``solution_turns`` and ``observations``, no
    ``solution``) are what scripts/run-smollm2-tool.sh warms up on: the CLI takes them."""
    from dataset.arith_tool import arith_tool_rows

    data, out = tmp_path / "demos.jsonl", tmp_path / "warm"
    data.write_text("".join(json.dumps(r) + "\n" for r in arith_tool_rows(4, seed=1, style="tiny")))
    assert main(["--model-dir", str(tiny_model_factory("qwen2.5")), "--data", str(data),
                 "--out", str(out), "--steps", "2", "--batch", "2", "--device", "cpu"]) == 0
    assert (out / "config.json").is_file() and "2 steps" in capsys.readouterr().out
