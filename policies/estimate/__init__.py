"""Estimate: engine snapshots over a sliding window -> Evidence with its uncertainty (window.py), the binomial
intervals it uses (intervals.py), and the per-model acceptance memory that stands in when nothing is measured
(memory.py)."""
