"""The leader election's metrics, with leader election on: `specadvisor_actuation_leader` (1 while this replica
acts) and `specadvisor_actuation_leader_transitions_total` (times it started or stopped acting), read per scrape
like the other actuation families (leading ends with the clock, not with a write).

`LeadershipCollector` is what the composition root (service/app.py) gives the /metrics page and the registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.actuators.leader import LeaseElector
from service.exporter import PREFIX


class LeadershipCollector(Collector):
    """This replica's standing in the leader election of the actuation."""

    def __init__(self, elector: LeaseElector) -> None:
        self._elector = elector

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        leader = GaugeMetricFamily(
            f"{PREFIX}_actuation_leader",
            "1 while this replica holds the actuation lease and may act; 0 while another replica does (or none "
            "yet), or this one could not renew it within the renew deadline: it advises only.",
            labels=[],
        )
        leader.add_metric([], 1.0 if self._elector.leading() else 0.0)
        transitions = CounterMetricFamily(
            f"{PREFIX}_actuation_leader_transitions",
            "Times this replica started or stopped acting as the leader (a handover counts once on each side).",
            labels=[],
        )
        transitions.add_metric([], float(self._elector.transitions))
        yield from (leader, transitions)
