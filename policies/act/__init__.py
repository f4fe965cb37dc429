"""Act: the actuation safety gate (gate.py) and the deployment values an actuator reads and writes
(deployment.py)."""
