"""Why a scrape failed, as a small closed set: the values are Prometheus label values on the scrape-error counter."""

from __future__ import annotations

import re
from enum import StrEnum

# scheme://userinfo@ : the userinfo (user, user:password, a token) up to the '@' before the host.
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")


def without_userinfo(text: str) -> str:
    """`text` with the userinfo dropped from every URL in it, so credentials never reach a reason, an API answer
    or a log line. Example: "http://user:pass@vllm:8000/metrics: HTTP 503" -> "http://vllm:8000/metrics: HTTP 503";
    an e-mail address (no scheme) is left alone."""
    return _USERINFO.sub(r"\1", text)


class ScrapeErrorReason(StrEnum):
    """Failure classes of one scrape. Values are lowercase snake case (used as a metric label)."""

    TIMEOUT = "timeout"  # no complete answer within the scrape timeout
    CONNECT = "connect"  # could not reach the peer (refused, DNS, bad URL)
    PROTOCOL = "protocol"  # the peer broke HTTP mid-answer (closed early, short body vs Content-Length)
    HTTP_STATUS = "http_status"  # an answer that is not 2xx
    CREDENTIALS = "credentials"  # the target's credentials file could not be read (service/sources/auth.py)
    BODY_TOO_LARGE = "body_too_large"  # more bytes than max_body_bytes (counted after content decoding)
    TOO_MANY_SERIES = "too_many_series"  # more series of the families we read than any real engine serves
    PARSE = "parse"  # not Prometheus text: undecodable bytes, a malformed or truncated line
    INVALID_VALUE = "invalid_value"  # NaN, Inf or negative where a count or ratio is expected; bad label values
    MISSING_FAMILY = "missing_family"  # a required series, or part of a family we need, is absent
    MODEL_MISSING = "model_missing"  # the engine's page carries no series of a served model at all
    UNKNOWN_ENGINE = "unknown_engine"  # a well-formed page with no series of an engine read (sources/engines.py)
    MIXED_ENGINES = "mixed_engines"  # series of several engines on one page, or not of the target's set engine


class ScrapeError(Exception):
    """A scrape that produced no usable snapshot. `detail` is for humans (logs, the REST evidence)."""

    def __init__(self, reason: ScrapeErrorReason, detail: str) -> None:
        detail = without_userinfo(detail)  # a target URL's credentials, or an exception text quoting it
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
