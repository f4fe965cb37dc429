"""HTTP: the API the sidecar serves (api.py: recommendation, evidence, health, metrics), the actuation
endpoints (actions.py) and what-if and schedules (whatif.py)."""
