"""Moves whose value is a trial's (policies/decide/value.py `trial_value`): where a turn-on goes, and whether a move
to more drafts is worth trying while on (policies/decide/publish.py `left_trial` says when a published change
leaves the last trial). Running a setting
measures it, and a worse one can be left at one more change's cost, so the way back bounds what a trial risks:

    V_try = T x mu + (H - T) x E[max(g, -C / (H - T))] - C        g ~ N(mu, sigma),  T = max(dwell_s, probe_min_s)
"""

from __future__ import annotations

import math

from policies.decide.explain import cause, describe, fmt_point
from policies.decide.publish import wait_s
from policies.decide.state import (
    Candidate,
    Prices,
    Tick,
    is_extrapolated,
    least_trial_s,
)
from policies.decide.value import (
    Key,
    Valued,
    expected_gain,
    point_at,
    trial_moments,
    trial_value,
    trial_value_of,
)
from policies.types import WhyCode


def try_more(
    tick: Tick, prices: Prices, current: Key, *, sure: Valued | None, note: str
) -> Candidate | None:
    """While on, a move to more drafts valued as a trial (value.trial_value from the running gamma: running it
    measures the positions past the measured k, and a worse gamma is left at one more change's cost). With a sure
    change to more drafts (`sure`), it goes to the gamma above the running one with the greatest trial value, as a
    turn-on does (None when that is `sure`'s own gamma: the sure change stands). With none, the gamma past the
    measured k (extrapolated: its positions never ran) with the greatest trial value, when that value is > 0 and
    its expected gain is at least the margin. Ties: the smaller gamma. Its wait is C today over this window's
    expected gain. The way back assumes the running gamma stays priced as measured; for a drafter whose shorter
    drafts are not prefixes of longer ones (suffix decoding) it is priced again from its band after the trial."""
    config = tick.config
    valued: dict[Key, tuple[float, float]] = {}
    for gamma in range(current[1] + 1, config.gamma_max + 1):
        key = (True, gamma)
        moments = trial_moments(prices.curve, current, key)
        value = None if moments is None else trial_value_of(
            moments, horizon_s=config.payback_horizon_s, cost_s=prices.cost_s, trial_s=least_trial_s(config))
        if moments is not None and value is not None:
            valued[key] = (value, moments[0])
    against = valued[sure.key][0] if sure is not None and sure.key in valued else math.nan
    tries = {key: vm for key, vm in valued.items() if vm[1] >= config.margin and (
        sure is not None or (vm[0] > 0 and is_extrapolated(prices.curve, key)))}
    if not tries:
        return None
    key = max(tries, key=lambda k: tries[k][0])  # in gamma order: max keeps the first of equals
    if sure is not None and key == sure.key:
        return None
    value, planned = tries[key]
    now_gain = expected_gain(tick.curve, current, key, trial=True)
    rent = planned if now_gain is None else now_gain
    wait = wait_s(cost_s=prices.today_s, gain=rent, confirm_s=config.confirm_s, dwell_s=config.dwell_s)
    point = point_at(prices.curve, key[1])
    text = (f"{note}; {describe(key)}{f' {fmt_point(point)}' if point is not None else ''} is worth trying: "
            f"expected {planned:+.1%}, worth {value:.0f}s over {config.payback_horizon_s:.0f}s net of the change's "
            f"{prices.cost_s:.1f}s (it runs at least {least_trial_s(config):.0f}s, which measures its positions, and a "
            f"worse setting can be left at one more change's cost)")
    if sure is not None:
        text += f"; more than {describe(sure.key)}, the sure change" + (f" ({against:.0f}s)" if math.isfinite(
            against) else "")
    text += (f", wait {wait:.0f}s (cost today {prices.today_s:.1f}s / gain expected now {rent:+.1%}, in "
             f"{config.confirm_s:.0f}..{config.dwell_s:.0f}s)")
    whys = (cause(WhyCode.GAIN, to_gamma=key[1], gain=rent, cost_s=prices.cost_s, wait_s=wait),
            cause(WhyCode.TRIAL, gamma=key[1], value_s=value, against_s=against if math.isfinite(against) else 0.0,
                 expected=rent))
    return Candidate(key=key, wait_s=wait, side=1, text=text, why=whys, trying=True)


def trial_for(tick: Tick, prices: Prices, choice: Key) -> tuple[Key, float, float] | None:
    """Where a turn-on that pays goes: the on option with the greatest trial value (value.trial_value: running it
    measures its acceptance, and a worse setting can be left at one change's cost), among the gammas whose
    acceptance is measured and the next one the curve offers past them (every gamma when none is). Returns (that
    key, its V_try, and the V_try of `choice`, the option the band's low end chose), or None when either cannot
    be priced. Ties: the smaller gamma."""
    config = tick.config
    on = sorted(key for key in prices.options if key[0] and point_at(prices.curve, key[1]) is not None)
    measured = [key[1] for key in on if not is_extrapolated(prices.curve, key)]
    past = [key[1] for key in on if measured and key[1] > max(measured)]
    reach = (past[0] if past else max(measured)) if measured else config.gamma_max
    def value(key: Key) -> float | None:
        return trial_value(prices.curve, key, horizon_s=config.payback_horizon_s, cost_s=prices.cost_s,
                           trial_s=least_trial_s(config))

    values = {key: v for key in on if key[1] <= reach and (v := value(key)) is not None}
    against = values[choice] if choice in values else value(choice)
    if not values or against is None:
        return None
    best = max(values, key=lambda key: values[key])  # `on` is sorted; max keeps the first of equals
    return best, values[best], against
