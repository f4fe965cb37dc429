"""Advice per route (policies/decide/routes.py): the pool each route belongs on, weighted by the tokens each target
generates, and its acceptance against the fleet's. Expected numbers are worked in each test."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_evidence

from policies.decide.routes import RoutedTarget, route_advice
from policies.types import DataState, Decision


def routed(route: str, name: str, *, enabled: bool, speedup: float, load: tuple[float, float],
           state: DataState = DataState.OK) -> RoutedTarget:
    """`load`: (generated tokens/s, accepted drafts per draft over 1000 drafts)."""
    rate, per_draft = load
    acceptance = replace(make_acceptance((0.5, 0.3, 0.1)), drafts=1000.0, accepted_tokens=1000.0 * per_draft)
    evidence = make_evidence(target=name, acceptance=acceptance, generation_tokens_per_s=rate)
    decision = Decision(target=name, model="m", state=state, enabled=enabled,
                        num_speculative_tokens=3 if enabled else 0, expected_speedup=speedup,
                        expected_speedup_low=speedup, expected_speedup_high=speedup, reason="", evaluated_at_s=1.0)
    return RoutedTarget(route=route, evidence=evidence, decision=decision)


def test_code_goes_on_a_spec_on_pool_and_chat_off() -> None:
    chat, code = route_advice([  # sorted by route name
        routed("code", "c1", enabled=True, speedup=1.9, load=(800.0, 2.0)),
        routed("code", "c2", enabled=True, speedup=1.7, load=(200.0, 2.0)),
        routed("chat", "p1", enabled=False, speedup=1.0, load=(300.0, 0.5)),
    ])
    assert (code.route, code.pool, code.targets) == ("code", "spec_on", ("c1", "c2"))
    assert code.share_on == 1.0
    assert code.expected_speedup == pytest.approx((800 * 1.9 + 200 * 1.7) / 1000)  # 1.86
    assert code.mean_acceptance_length == pytest.approx(3.0)
    # fleet: (2000 + 2000 + 500) accepted / 3000 drafts = 1.5 per draft; code 2.0 / 1.5, chat 0.5 / 1.5
    assert code.relative_acceptance == pytest.approx(2.0 / 1.5)
    assert (chat.pool, chat.share_on) == ("spec_off", 0.0)
    assert chat.relative_acceptance == pytest.approx(0.5 / 1.5)


def test_the_share_is_weighted_by_generated_tokens() -> None:
    # one busy target off (900 tokens/s), one quiet target on (100): 10% on -> off pool
    [mixed] = route_advice([
        routed("mixed", "a", enabled=False, speedup=1.0, load=(900.0, 1.0)),
        routed("mixed", "b", enabled=True, speedup=1.5, load=(100.0, 1.0)),
    ])
    assert mixed.share_on == pytest.approx(0.1) and mixed.pool == "spec_off"


def test_a_route_without_an_ok_decision_is_unknown() -> None:
    [route] = route_advice([routed("r", "a", enabled=True, speedup=1.5, load=(10.0, 1.0),
                                   state=DataState.STALE)])
    assert route.pool == "unknown" and route.share_on is None and route.mean_acceptance_length == pytest.approx(2.0)
