"""Measurements of the engine, the trainer and the loop, grouped by kind (README.md)."""
