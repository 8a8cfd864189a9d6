"""End-to-end studies: the loop in layouts and placements, long rollouts, run scripts, the inference frontier."""
