"""Decide: the speedup curve -> the published recommendation. The one rule and its wait clock (rule.py), each
option's value (value.py), what a change costs (change_cost.py), the recent load it is weighed over (horizon.py),
when to look again while off (probe.py), and the decision said in one sentence (summary.py)."""
