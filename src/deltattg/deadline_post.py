"""One JSON POST under one deadline: what the served meter and the retrieval client send their requests with.

    post = DeadlinePost("http://127.0.0.1:8000/retrieve", timeout_s=30)
    answer = post.send(json.dumps({"queries": ["who wrote Hamlet"], "topk": 3}).encode())
    answer.body      # the 2xx body, or None; answer.error says why not (the HTTP status or error, and the URL)

* **One deadline per request.** ``timeout_s`` bounds everything one request may cost: connecting, sending, waiting, a
  body that trickles in byte by byte, every retry and every backoff. The socket timeout is recomputed from the time
  left before every read, the body is read in chunks with the clock checked between them, and a watchdog shuts the
  socket down at the deadline (so a slow status line or slow headers cannot outlive it either).
  ``attempt_timeout_s`` optionally caps one attempt, leaving time for another.
* **Bounded retries.** A connection error, a timed-out attempt, HTTP 408/429 or 5xx is retried at most
  ``max_retries`` times after ``backoff_s``·2^k seconds, while the deadline leaves room; anything else is final.
* **Redirects are never followed.** A 3xx is a failure naming the status, the URL and the ``Location`` (give the
  final URL instead), so headers such as ``Authorization`` only ever go to the origin given.
* **Bodies are bounded.** A 2xx body over ``max_body_bytes`` is a failure, not read on.

Standard library only (``http.client``); proxies come from the usual environment variables (``http_proxy``,
``https_proxy``, ``no_proxy``).
"""

from __future__ import annotations

import base64
import http.client
import logging
import math
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class Answer:
    """What one request came to, retries included."""

    body: bytes | None  # the 2xx body, or None
    attempts: int
    error: str | None = None  # why there is no body: the HTTP status (or error) and the URL
    answered: bool = True  # whether any HTTP answer arrived (False: refused, reset, timed out)


@dataclass(frozen=True)
class _Attempt:
    body: bytes | None  # the 2xx body, or None
    error: str | None = None
    retry: bool = False
    answered: bool = True


class _DeadlineError(Exception):
    """The attempt's time ran out (raised by the body reader, or inferred after the watchdog closed the socket)."""


class _BodyTooLarge(Exception):
    """A 2xx body beyond the limit: not the answer asked for, and not worth asking again."""


def positive_seconds(value: Any, name: str) -> float:
    """``value`` as a positive, finite number of seconds; ``ValueError`` naming ``name`` otherwise."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return seconds


def http_url_parts(url: Any, what: str = "url") -> urllib.parse.SplitResult:
    """The parts of an http(s) URL without credentials; ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"{what} must be an http(s) URL, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 - validates the port
    except ValueError as err:
        raise ValueError(f"{what} {url!r} is not a valid URL: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http(s) URL, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{what} must not carry credentials: pass the key as api_key")
    return parts


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt: request timeout, rate limit or a server error."""
    return status in (408, 429) or 500 <= status <= 599


def snippet(body: bytes) -> str:
    """The start of a body on one line, for an error message."""
    text = " ".join(body.decode("utf-8", "replace").split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


class DeadlinePost:
    """POSTs to one http(s) ``url`` with the failure behaviour of the module docstring; thread-safe (each request
    opens its own connection)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        attempt_timeout_s: float | None = None,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_body_bytes: int = 1 << 20,
        headers: dict[str, str] | None = None,
        timeout_name: str = "timeout_s",
    ):
        parts = http_url_parts(url)
        if max_retries < 0:
            raise ValueError(f"max_retries must be non-negative, got {max_retries}")
        if not (math.isfinite(backoff_s) and backoff_s >= 0):
            raise ValueError(f"backoff_s must be a non-negative number of seconds, got {backoff_s!r}")
        self.url = urllib.parse.urlunsplit(parts)
        self.timeout_s = positive_seconds(timeout_s, timeout_name)
        self.attempt_timeout_s = (None if attempt_timeout_s is None
                                  else positive_seconds(attempt_timeout_s, "attempt_timeout_s"))
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_body_bytes = max_body_bytes
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close",
                        **(headers or {})}
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._target = urllib.parse.urlunsplit(("", "", parts.path, parts.query, ""))
        self._proxy = _proxy_for(parts.scheme, self._host)
        self._ssl = ssl.create_default_context() if self._https else None  # shared by threads (thread-safe)

    def send(self, payload: bytes, stop: threading.Event | None = None) -> Answer:
        """POST ``payload``: the 2xx body, or why not, with bounded retries on transient failures, all within one
        deadline of ``timeout_s``; setting ``stop`` (the caller left) ends the backoff and makes no more attempts."""
        deadline = time.monotonic() + self.timeout_s
        attempts = 0
        answered = False
        while True:
            attempts += 1
            until = deadline
            if self.attempt_timeout_s is not None:
                until = min(deadline, time.monotonic() + self.attempt_timeout_s)
            result = self._attempt(payload, until, deadline)
            answered = answered or result.answered
            if result.body is not None:
                return Answer(result.body, attempts)
            logger.debug("%s (attempt %d)", result.error, attempts)
            failed = Answer(None, attempts, result.error, answered)
            if not result.retry or attempts > self.max_retries:
                return failed
            wait = self.backoff_s * 2 ** (attempts - 1)
            if time.monotonic() + wait >= deadline:
                return failed
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):
                return failed

    def _attempt(self, payload: bytes, until: float, deadline: float) -> _Attempt:
        """One POST that ends by ``until``: the body of a 2xx answer, or why not and whether to retry."""
        limit = f"the {self.timeout_s:g} s deadline" if until >= deadline else f"{self.attempt_timeout_s:g} s"
        left = until - time.monotonic()
        if left <= 0:
            return _Attempt(None, f"no answer from {self.url} within {limit}", retry=False, answered=False)
        conn = self._connection(left)
        watchdog: threading.Timer | None = None
        try:
            conn.connect()
            watchdog = threading.Timer(max(until - time.monotonic(), 0.0), _shut, args=(conn.sock,))
            watchdog.daemon = True
            watchdog.start()
            _settimeout(conn, until)
            conn.request("POST", self._request_target(), body=payload, headers=self.headers)
            _settimeout(conn, until)
            response = conn.getresponse()
            status = response.status
            if 200 <= status < 300:
                return _Attempt(_read_body(conn, response, until, self.max_body_bytes, strict=True))
            detail = snippet(_read_body(conn, response, until, 4 * SNIPPET_CHARS, strict=False))
            error = f"HTTP {status} {response.reason} from {self.url}".rstrip()
            if 300 <= status < 400:
                location = response.getheader("Location")
                where = urllib.parse.urljoin(self.url, location) if location else None
                other = where is not None and _origin(where) != _origin(self.url)
                return _Attempt(None, f"{error}: redirect{' to another origin' if other else ''} to {where} not "
                                f"followed (give the final URL)", retry=False)
            return _Attempt(None, f"{error}: {detail}" if detail else error, retry=is_retryable_status(status))
        except _DeadlineError:
            return _Attempt(None, f"no complete answer from {self.url} within {limit}", retry=until < deadline,
                            answered=False)
        except _BodyTooLarge:
            return _Attempt(None, f"HTTP {status} from {self.url}: a body over {self.max_body_bytes} bytes is not "
                            "the answer asked for")
        except ssl.SSLCertVerificationError as err:  # asking again will not change the certificate
            return _Attempt(None, f"no answer from {self.url}: {err}", retry=False, answered=False)
        except (OSError, http.client.HTTPException, ValueError) as err:  # refused, reset, timed out, bad status line
            if time.monotonic() >= until:
                return _Attempt(None, f"no complete answer from {self.url} within {limit}", retry=until < deadline,
                                answered=False)
            reason = str(err) or type(err).__name__
            return _Attempt(None, f"no answer from {self.url}: {reason}", retry=True, answered=False)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            conn.close()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._proxy is None:
            if self._https:
                return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        proxy_host, proxy_port, proxy_auth = self._proxy
        if self._https:  # CONNECT tunnel through the proxy, as urllib does
            conn = http.client.HTTPSConnection(proxy_host, proxy_port, timeout=timeout, context=self._ssl)
            conn.set_tunnel(self._host, self._port, headers=proxy_auth)
            return conn
        return _ProxiedHTTPConnection(proxy_host, proxy_port, timeout=timeout, proxy_headers=proxy_auth)

    def _request_target(self) -> str:
        return self.url if self._proxy is not None and not self._https else self._target


class _ProxiedHTTPConnection(http.client.HTTPConnection):
    """A plain-HTTP connection to a forward proxy that adds its ``Proxy-Authorization`` to every request."""

    def __init__(self, host: str, port: int, *, timeout: float, proxy_headers: dict[str, str] | None):
        super().__init__(host, port, timeout=timeout)
        self._proxy_headers = proxy_headers or {}

    def request(self, method, url, body=None, headers=None, **kwargs):  # type: ignore[override]
        super().request(method, url, body=body, headers={**(headers or {}), **self._proxy_headers}, **kwargs)


def _proxy_for(scheme: str, host: str) -> tuple[str, int, dict[str, str] | None] | None:
    """``(host, port, Proxy-Authorization headers)`` of the environment's proxy for ``scheme``, unless ``host`` is
    exempt (``no_proxy``)."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    parts = urllib.parse.urlsplit(proxy)
    if not parts.hostname:
        return None
    headers = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers = {"Proxy-Authorization": f"Basic {token}"}
    return parts.hostname, parts.port or 80, headers


def _origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme, -1)


def _shut(sock: socket.socket | None) -> None:
    """The watchdog: end every blocked read or write on ``sock`` (the deadline has come)."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS: no TLS state touched
    except OSError:
        pass


def _settimeout(conn: http.client.HTTPConnection, until: float) -> None:
    left = until - time.monotonic()
    if left <= 0:
        raise _DeadlineError
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _read_body(conn: http.client.HTTPConnection, response: http.client.HTTPResponse, until: float, limit: int, *,
               strict: bool) -> bytes:
    """The response body, read in chunks that each wait at most for the time left: a server trickling its answer
    cannot keep the request past ``until``. ``strict`` (a 2xx body): a body over ``limit`` bytes, cut short or late is
    an error. Otherwise (an error page, read only to quote it) whatever arrived by then, cut at ``limit``."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            _settimeout(conn, until)
            chunk = response.read1(_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if time.monotonic() >= until:
            raise _DeadlineError
    except (_DeadlineError, OSError, http.client.HTTPException):
        if strict:
            raise
    body = b"".join(chunks)
    if strict and size > limit:
        raise _BodyTooLarge
    if strict and response.length:  # the connection ended before Content-Length bytes came
        raise http.client.IncompleteRead(body, response.length)
    return body[:limit]
