"""after_failed_scrape: a failed scrape's evidence is stale while the last good one is recent, else an error."""

from __future__ import annotations

from costmodel_builders import make_evidence

from policies.estimate.window import EstimatorConfig, after_failed_scrape
from policies.types import DataState

CONFIG = EstimatorConfig(stale_after_s=30.0)


def test_recent_good_data_is_stale_and_old_or_none_is_an_error() -> None:
    evidence = make_evidence()
    recent = after_failed_scrape(evidence, failure="HTTP 503", last_good_s=990.0, now_s=1000.0, config=CONFIG)
    assert recent.state is DataState.STALE and recent.reason == "HTTP 503; last good scrape 10 s ago"
    edge = after_failed_scrape(evidence, failure="HTTP 503", last_good_s=970.0, now_s=1000.0, config=CONFIG)
    assert edge.state is DataState.STALE  # exactly stale_after_s old: still stale
    old = after_failed_scrape(evidence, failure="HTTP 503", last_good_s=900.0, now_s=1000.0, config=CONFIG)
    assert old.state is DataState.ERROR and old.reason == "HTTP 503; last good scrape 100 s ago"
    never = after_failed_scrape(evidence, failure="timeout", last_good_s=None, now_s=1000.0, config=CONFIG)
    assert never.state is DataState.ERROR and never.reason == "timeout; last good scrape never"
    assert old.acceptance == evidence.acceptance  # the numbers are kept, only the state and reason change
