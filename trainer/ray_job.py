"""``python -m trainer.ray_job``: the trainer on a Ray cluster, with slime's launch flags
(``--actor-num-nodes``, ``--actor-num-gpus-per-node``, ``--rollout-num-gpus``,
``--rollout-num-gpus-per-engine``, ``--colocate``); every other flag goes to ``trainer.train``.
The parts are in ``trainer/ray/``."""

from __future__ import annotations

from .ray.job import main

if __name__ == "__main__":
    raise SystemExit(main())
