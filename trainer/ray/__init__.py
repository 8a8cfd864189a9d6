"""The trainer on a Ray cluster: ``python -m trainer.ray_job`` (slime's launch flags).

    options.py      the Ray flags (--actor-num-nodes, --rollout-num-gpus, ...) and their checks
    cluster.py      connect to a cluster, or start a local one (fake GPU slots on a CPU machine)
    placement.py    placement groups: one {GPU: 1, CPU: 1} bundle per GPU, ordered by node
    trainer_actor.py  one trainer rank: torchrun's environment, then ``trainer.train.main``
    engines.py      a disaggregated rollout engine: the sglang-kvc HTTP server in an actor
    router.py       sglang-router in front of the engines (for clients besides the trainer)
    supervisor.py   a dead engine replaced on its GPU bundle, and the trainer's restart hook
    job.py          the order of it all, progress, failure and clean-up

Every actor belongs to the job: when the job ends, fails or is interrupted, all of them are
killed (engine servers live inside their actors; the router dies with its actor; the supervisor
kills the engines it started).
"""
