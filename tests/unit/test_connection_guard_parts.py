"""The API connection guard's parts without a server: its settings, its counts and rate-limited warnings, its
metric family. The guard on real sockets: tests/integration/test_api_connection_guard.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.exporter import ApiConnectionsCollector
from service.http.connection_guard import CLOSE_REASONS, ConnectionGuard
from service.settings import SettingsError, load_settings

ONE_TARGET = [{"name": "a", "url": "http://127.0.0.1:8000"}]


def test_the_defaults_bound_connections_and_request_reads() -> None:
    settings = load_settings(overrides={"targets": ONE_TARGET})
    assert settings.api_max_connections == 256
    assert settings.api_request_read_timeout_s == 10.0


def test_the_settings_come_from_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_API_MAX_CONNECTIONS", "64")
    monkeypatch.setenv("SPEC_ADVISOR_API_REQUEST_READ_TIMEOUT_S", "2.5")
    settings = load_settings(overrides={"targets": ONE_TARGET})
    assert (settings.api_max_connections, settings.api_request_read_timeout_s) == (64, 2.5)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("api_max_connections", 0, "greater than or equal to 1"),
        ("api_max_connections", 70000, "less than or equal to 65536"),
        ("api_max_connections", "many", "valid integer"),
        ("api_request_read_timeout_s", 0, "greater than 0"),
        ("api_request_read_timeout_s", -1, "greater than 0"),
        ("api_request_read_timeout_s", 601, "less than or equal to 600"),
        ("api_request_read_timeout_s", "nan", "finite number"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(overrides={"targets": ONE_TARGET, field: value})
    assert f"  {field}: " in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("max_connections", "read_timeout_s"), [(0, 10.0), (256, 0.0), (256, -1.0), (256, float("nan"))]
)
def test_the_guard_refuses_limits_that_bound_nothing(max_connections: int, read_timeout_s: float) -> None:
    with pytest.raises(ValueError, match=r"^(max_connections|read_timeout_s) must be"):
        ConnectionGuard(max_connections=max_connections, read_timeout_s=read_timeout_s)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def warnings_logged() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger("spec_advisor.api.connections")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_closes_are_counted_per_reason_and_warned_at_most_once_a_minute_per_reason(
    warnings_logged: list[logging.LogRecord],
) -> None:
    now_s = [1000.0]
    guard = ConnectionGuard(max_connections=4, read_timeout_s=1.0, clock=lambda: now_s[0], warn_interval_s=60.0)
    assert guard.closed() == dict.fromkeys(CLOSE_REASONS, 0)

    for _ in range(3):
        guard.record_close("read_timeout", client="10.0.0.1:5000", open_connections=2)
    guard.record_close("over_limit", client="10.0.0.2:5000", open_connections=4)
    assert guard.closed() == {"read_timeout": 3, "over_limit": 1}
    # One warning per reason: the first close of each.
    assert [r.fields["reason"] for r in warnings_logged] == ["read_timeout", "over_limit"]  # type: ignore[attr-defined]

    now_s[0] += 59.0
    guard.record_close("read_timeout", client="10.0.0.1:5001", open_connections=2)
    assert len(warnings_logged) == 2  # still within the minute
    now_s[0] += 1.0
    guard.record_close("read_timeout", client="10.0.0.1:5002", open_connections=2)
    assert len(warnings_logged) == 3
    last = warnings_logged[-1].fields  # type: ignore[attr-defined]
    assert last["reason"] == "read_timeout"
    assert last["closed_total"] == 5
    assert last["unlogged_since_last_warning"] == 3  # the 2nd, 3rd and 4th close
    assert last["client"] == "10.0.0.1:5002"
    assert guard.closed() == {"read_timeout": 5, "over_limit": 1}


def test_the_counter_family_has_every_reason_from_zero() -> None:
    def families(closed: dict[str, int]) -> dict[str, float]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ApiConnectionsCollector(lambda: closed))
        text = generate_latest(registry).decode()
        [family] = text_string_to_metric_families(text)
        assert (family.name, family.type) == ("specadvisor_api_connections_closed", "counter")
        return {sample.labels["reason"]: sample.value for sample in family.samples if sample.name.endswith("_total")}

    assert families({}) == {"read_timeout": 0.0, "over_limit": 0.0}
    assert families({"over_limit": 7}) == {"read_timeout": 0.0, "over_limit": 7.0}
