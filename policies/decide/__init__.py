"""Decide: the speedup curve -> the published recommendation. The one rule (rule.py) with what it takes and carries
(state.py), its wait clock (publish.py), the trials that measure what the model cannot price (trial.py), holding on
without good evidence (hold.py) and the reason's words (explain.py); each option's value (value.py), what a change
costs (change_cost.py), the recent load it is weighed over (horizon.py), when to look again while off (probe.py),
and the decision said in one sentence (summary.py)."""
