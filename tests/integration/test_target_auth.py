"""Credentials to a target from files, never from the URL: a real HTTP peer on 127.0.0.1 that answers 401 unless
the Authorization header is the one it expects (issue: credentials in a target URL leaked into reasons and logs).

Waits are bounded polls for a behaviour (sidecar_http.wait_for), never timing assertions.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sidecar_http import served_in_thread, serving, wait_for

from service.app import build_sidecar
from service.settings import SettingsError, load_settings
from service.sources.auth import BasicFileAuth, BearerFileAuth
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.gpu import NoGpuSource
from service.sources.prometheus import FleetSelection, PrometheusFleetSource
from service.sources.scraper import EngineScraper

CAPTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
           / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_bytes()
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
T = 1_800_000_000.0
TOKEN = "tok-3f9a-secret"


class GuardedPeer(ThreadingHTTPServer):
    """Serves the vLLM capture on /metrics (and an empty Prometheus vector on /api/v1/query) only to a request
    whose Authorization header equals `expected`; 401 otherwise. Records every header it was sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.expected = f"Bearer {TOKEN}"
        self.seen: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: GuardedPeer

    def do_GET(self) -> None:
        header = self.headers.get("Authorization")
        self.server.seen.append(header)
        body = EMPTY_VECTOR if self.path.startswith("/api/v1/query") else CAPTURE
        status = 200 if header == self.server.expected else 401
        if status == 401:
            body = b"unauthorized\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def peer() -> Iterator[GuardedPeer]:
    with served_in_thread(GuardedPeer()) as server:
        yield server


def scrape(url: str, auth: httpx.Auth | None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            return dict(await EngineScraper(client, f"{url}/metrics", auth=auth).scrape(T))

    return asyncio.run(go())


def scrape_error(url: str, auth: httpx.Auth | None) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        scrape(url, auth)
    return caught.value


def test_a_bearer_token_file_is_sent_and_reread_after_rotation(peer: GuardedPeer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")  # a trailing newline, as most tools write a secret
    auth = BearerFileAuth(token)
    assert scrape(peer.url, auth)["tiny"].spec is not None
    # The Secret rotates: the file is rewritten and the server wants the new token from now on.
    token.write_text("tok-rotated\n")
    peer.expected = "Bearer tok-rotated"
    assert "tiny" in scrape(peer.url, auth)
    assert peer.seen == [f"Bearer {TOKEN}", "Bearer tok-rotated"]


def test_without_credentials_the_peer_refuses_and_the_error_says_401(peer: GuardedPeer) -> None:
    error = scrape_error(peer.url, None)
    assert error.reason is ScrapeErrorReason.HTTP_STATUS
    assert "401" in error.detail
    assert peer.seen == [None]


def test_basic_auth_sends_the_user_and_the_password_from_its_file(peer: GuardedPeer, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    peer.expected = "Basic " + base64.b64encode(b"advisor:s3cret").decode()
    assert "tiny" in scrape(peer.url, BasicFileAuth("advisor", password))


@pytest.mark.parametrize(
    "content", [None, b"", b"  \n", b"two\nlines\n", b"\xff\xfe", b"x" * 20_000, b"SECRET\x0bTOKEN", b"caf\xc3\xa9"]
)
def test_an_unusable_credentials_file_fails_the_scrape_naming_the_path_only(
    peer: GuardedPeer, tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content)
    error = scrape_error(peer.url, BearerFileAuth(path))
    assert error.reason is ScrapeErrorReason.CREDENTIALS
    assert str(path) in error.detail
    secret = (content or b"").decode("utf-8", errors="ignore").strip()
    assert not secret or secret not in error.detail
    assert peer.seen == []  # nothing was sent without its credentials


def test_fleet_mode_sends_the_credentials_to_prometheus(peer: GuardedPeer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            source = PrometheusFleetSource(
                client, peer.url, FleetSelection(model="tiny", selector="", rate_window_s=60.0),
                timeout_s=2.0, auth=BearerFileAuth(token),
            )
            with pytest.raises(ScrapeError) as caught:
                await source.scrape(T)
            # The empty vector means "no replicas"; what matters is that every query was let in.
            assert caught.value.reason is ScrapeErrorReason.MODEL_MISSING

    asyncio.run(go())
    assert peer.seen and all(header == f"Bearer {TOKEN}" for header in peer.seen)


def _settings(url: str, auth: dict[str, Any]) -> Any:
    return load_settings(
        overrides={
            "targets": [{"name": "guarded", "url": url, "hardware": "cpu", "model_profile": "tiny-llama",
                         "drafter": {"method": "ngram"}, **auth}],
            "scrape_interval_s": 0.25,
            "scrape_timeout_s": 0.25,
            "gpu": {"telemetry": "none"},
        }
    )


def test_the_sidecar_scrapes_a_guarded_target_from_its_settings(peer: GuardedPeer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    settings = _settings(peer.url, {"authorization": {"credentials_file": str(token)}})

    async def scenario() -> None:
        sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            answer = await wait_for(client, "/v1/evidence", lambda r: r.json()["targets"][0]["last_error"] is None
                                    and r.json()["targets"][0]["deployed_k"] == 3)
            assert answer.json()["targets"][0]["speculation_on"] is True
            # A wrong token afterwards: the error names the 401, and no response of the API carries the token.
            token.write_text("wrong-token")
            await wait_for(client, "/v1/evidence", lambda r: "401" in (r.json()["targets"][0]["last_error"] or ""))
            token.write_text(TOKEN)
            for path in ("/v1/evidence", "/v1/recommendation", "/metrics"):
                assert TOKEN not in (await client.get(path)).text
                assert "wrong-token" not in (await client.get(path)).text

    asyncio.run(scenario())


def test_both_schemes_at_once_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="authorization or basic_auth"):
        _settings("http://127.0.0.1:9", {
            "authorization": {"credentials_file": str(tmp_path / "t")},
            "basic_auth": {"username": "u", "password_file": str(tmp_path / "p")},
        })


def test_a_username_with_a_colon_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="RFC 7617"):
        _settings("http://127.0.0.1:9", {"basic_auth": {"username": "a:b", "password_file": str(tmp_path / "p")}})
