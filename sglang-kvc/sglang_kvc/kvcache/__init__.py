"""KV memory: the slot pool, the free-slot allocator, per-request slot tables."""
