"""Data preparation, formats and synthetic task generators."""
