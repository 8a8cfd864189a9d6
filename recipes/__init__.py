"""Recipes users bring from other GRPO trainers, as plug-ins of ``trainer.train`` (its extension
points: ``--custom-rm-path pkg.module:func``), never as forks of the loop. See recipes/README.md."""
