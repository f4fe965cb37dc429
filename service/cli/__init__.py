"""The command line: spec-advisor's commands (command.py), the demo's terminal view (view.py), the bench and
what-if plots (plot.py) and the profile command (profile_command.py)."""
