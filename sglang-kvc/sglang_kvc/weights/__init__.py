"""Weights: loading safetensors into the model, and the transports of weight updates."""
