"""Component benchmarks of the trainer: train and RL steps, log-prob kernels, replay, conversion, grading."""
