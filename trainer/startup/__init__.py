"""Start-up checks run before any rank: flags and data against the model (preflight.py)."""
