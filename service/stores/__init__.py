"""What the sidecar keeps across restarts: the acceptance memory (memory.py)."""
