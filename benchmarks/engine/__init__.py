"""Component benchmarks of the sglang-kvc engine: decode, sampling, compression, FP8 KV, weight sync."""
