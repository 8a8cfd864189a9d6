"""Progress bars in a log file: plain lines, no carriage returns or cursor codes; a line written
meanwhile stays whole and outside the bar; on a terminal, tqdm's own bar."""

from __future__ import annotations

import io

from evaluation import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_off_a_terminal_writes_plain_lines(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(progress.sys, "stdout", log)
    with progress.progress_bar(total=3, desc="rollouts", file=log) as outer:
        for i in range(3):
            with progress.progress_bar(total=2, desc="generate", leave=False, file=log) as inner:
                inner.update(2)
            progress.write(f"note {i}: a line of its own")
            outer.set_postfix(reward=f"0.{i}")  # shown in the next line
            outer.update()
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text, repr(text)
    lines = text.splitlines()
    assert all(line.strip() == line and line for line in lines), lines
    assert [line for line in lines if line.startswith("note")] == [
        f"note {i}: a line of its own" for i in range(3)]
    rollouts = [line for line in lines if line.startswith("rollouts: ")]
    assert rollouts[0].startswith("rollouts: 0/3 [") and "reward" not in rollouts[0], rollouts
    assert rollouts[-1].startswith("rollouts: 3/3 [") and "reward=0.2" in rollouts[-1], rollouts
    assert len(rollouts) <= 5  # the first draw, lines around the notes, the last: no redraw storm


def test_a_bar_on_a_terminal_is_tqdms(monkeypatch):
    tty = Terminal()
    with progress.progress_bar(total=2, desc="grading", file=tty) as bar:
        bar.update(2)
    assert "\r" in tty.getvalue() and "grading: 100%|" in tty.getvalue()
