"""Credentials for a scrape target, read from files at every request, so nobody needs them in a URL.

Two schemes, as Prometheus' own scrape configuration names them:

    authorization: {type: Bearer, credentials_file: F}   ->  Authorization: Bearer <F's content>
    basic_auth: {username: U, password_file: F}          ->  Authorization: Basic base64(U:<F's content>)

The file is read on every request (a Kubernetes Secret volume or a projected token is rewritten in place when it
rotates, and the next scrape uses the new value) with surrounding whitespace stripped (a trailing newline is how
most tools write a secret). A file that cannot be read, or is empty, fails that scrape with reason `credentials`
and its path, never its content; nothing here logs a credential.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import httpx

from service.sources.errors import ScrapeError, ScrapeErrorReason

# A credential is a token or a password: a few KB at most (a Kubernetes projected token is ~1 KB). A larger file is
# the wrong file, and is not sent.
MAX_CREDENTIAL_BYTES = 16 * 1024


def read_credential(path: Path) -> str:
    """The stripped content of `path`. Raises ScrapeError(CREDENTIALS) when it is unreadable, empty, larger than
    `MAX_CREDENTIAL_BYTES`, not UTF-8, holds a line break inside (it would split the header) or any character but
    visible ASCII (the HTTP library would refuse the header and quote it, credential included, in its error)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CREDENTIAL_BYTES + 1)
    except OSError as exc:
        raise ScrapeError(ScrapeErrorReason.CREDENTIALS, f"cannot read {path}: {exc.strerror or exc}") from exc
    problem = ""
    if len(raw) > MAX_CREDENTIAL_BYTES:
        problem = f"larger than {MAX_CREDENTIAL_BYTES} bytes"
    else:
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            value, problem = "", "not UTF-8"
        if not problem and not value:
            problem = "empty"
        elif "\n" in value or "\r" in value:
            problem = "more than one line"
        elif not problem and not all(" " < c <= "~" for c in value):
            problem = "not printable ASCII (a token is visible characters only, RFC 6750's token68)"
    if problem:
        raise ScrapeError(ScrapeErrorReason.CREDENTIALS, f"{path}: {problem}")
    return value


class BearerFileAuth(httpx.Auth):
    """`Authorization: Bearer <token>` with the token read from `path` at each request."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {read_credential(self._path)}"
        yield request


class BasicFileAuth(httpx.Auth):
    """`Authorization: Basic base64(username:password)` with the password read from `path` at each request.
    Example: username "advisor", password "s3cret" -> "Basic YWR2aXNvcjpzM2NyZXQ=" (RFC 7617)."""

    def __init__(self, username: str, path: Path) -> None:
        self._username = username
        self._path = path

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        yield from httpx.BasicAuth(self._username, read_credential(self._path)).auth_flow(request)
