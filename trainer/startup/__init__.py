"""How a run starts and stops: the checks before any rank (preflight.py), torchrun quiet on
Ctrl-C (torchrun.py), the one line an interrupt prints and the command that resumes (interrupt.py)."""
