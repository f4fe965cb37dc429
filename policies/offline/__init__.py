"""Offline: answers priced from the same model outside the tick: per-batch engine schedules (schedule.py) and
what-if questions about a hypothetical deployment (whatif.py)."""
