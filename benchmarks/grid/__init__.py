"""The correction grid: quickstart runs side by side, in paired waves, with their statistics."""
