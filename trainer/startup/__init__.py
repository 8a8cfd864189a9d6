"""How a run starts and stops: the flags' ranges right after parsing (flag_checks.py), the
checks before any rank (preflight.py), torchrun quiet on Ctrl-C (torchrun.py), the one line an
interrupt prints and the command that resumes (interrupt.py)."""
