"""A progress meter served behind an OpenAI-compatible endpoint (vLLM, SGLang: ``POST {base}/v1/chat/completions``).

Each decision prefix becomes one chat-completion request with the meter prompt (:mod:`deltattg.meter.prompt`),
greedy decoding (``temperature`` 0) and a small ``max_tokens``; requests of a batch run concurrently on at most
``concurrency`` worker threads.

Failure behaviour, all of it bounded:

* **One deadline per reading.** ``timeout_s`` (the CLI's ``--meter-timeout``, default 60 s) bounds everything one
  prefix may cost: connecting, sending, waiting, a body that trickles in byte by byte, every retry and every backoff.
  The socket timeout is recomputed from the time left before every read, the body is read in chunks with the clock
  checked between them, and a watchdog shuts the socket down at the deadline (so a slow status line or slow headers
  cannot outlive it either). ``attempt_timeout_s`` optionally caps one attempt, leaving time for another.
* **Bounded retries.** A connection error, a timed-out attempt, HTTP 408/429 or 5xx is retried at most
  ``max_retries`` times after ``backoff_s``·2^k seconds, while the deadline leaves room; anything else is final.
* **Redirects are never followed.** A 3xx is a failed reading whose warning names the status, the URL and the
  ``Location`` (point the meter at the final URL instead). The ``Authorization`` header therefore only ever goes to
  the origin given.
* **A dead server is not waited on for every prefix.** After ``trip_after`` prefixes in a row (default: one wave,
  ``max(concurrency, 4)``) got no HTTP answer at all (refused, reset, timed out), further prefixes fail at once
  without a request for one deadline's time (those already sent run to their deadline); then the endpoint is tried
  again: one more unanswered prefix stops it again, any HTTP answer resumes normal sending.
* **Failures are readings, not exceptions.** Whatever fails — and a body that is not a chat completion, or an answer
  :func:`~deltattg.meter.answer.parse_answer` rejects — is an invalid reading (``None``) for that prefix, counted in
  :class:`EndpointStats` and logged as one warning per batch with the HTTP status (or the error) and the URL, so
  Algorithm 1 falls back for that group and training goes on.
* **Ctrl-C is prompt.** Workers are daemon threads; a ``KeyboardInterrupt`` while a batch is in flight propagates at
  once (requests still in flight are abandoned, nothing waits for them).

The URL follows the OpenAI convention: the API root ``http://host:8000/v1``. A URL without ``/v1`` gets it
(``http://host:8000`` posts to ``http://host:8000/v1/chat/completions``); one that already ends in
``/chat/completions`` is used as is. Standard library only (``http.client``); proxies come from the usual environment
variables (``http_proxy``, ``https_proxy``, ``no_proxy``).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import queue
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from deltattg.data.trajectory import MeterOutput
from deltattg.meter.answer import parse_answer
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages

logger = logging.getLogger(__name__)

Outcome = Literal["ok", "failure", "invalid"]

CHAT_PATH = "/chat/completions"
MAX_BODY_BYTES = 1 << 20  # a chat completion of a few dozen tokens is well under this
_CHUNK = 1 << 16
_SNIPPET_CHARS = 200
_GRACE_S = 1.0  # a request whose worker is stuck past deadline + this (e.g. in name resolution) is abandoned
_POLL_S = 0.2


@dataclass
class EndpointStats:
    """Running counts of an :class:`EndpointMeter`."""

    prefixes: int = 0  # decision prefixes asked for
    requests: int = 0  # HTTP requests sent, retries included
    retries: int = 0  # requests that repeated a failed one
    failures: int = 0  # prefixes without a usable completion: no request possible, or every attempt failed
    invalid_answers: int = 0  # prefixes whose completion arrived but did not parse as an answer
    skipped: int = 0  # of the failures, prefixes not sent because the endpoint had stopped answering
    last_error: str | None = field(default=None, compare=False)  # the latest failure, with HTTP status and URL


@dataclass(frozen=True)
class _Result:
    """What one prefix's requests came to (built on a worker thread, counted on the caller's)."""

    reading: MeterOutput | None
    attempts: int
    outcome: Outcome
    error: str | None = None  # why it failed: the HTTP status (or error) and the URL
    answered: bool = True  # whether any HTTP answer arrived (False: refused, reset, timed out, skipped)
    skipped: bool = False


@dataclass(frozen=True)
class _Attempt:
    body: bytes | None  # the 2xx body, or None
    error: str | None = None
    retry: bool = False
    answered: bool = True


class _DeadlineError(Exception):
    """The attempt's time ran out (raised by the body reader, or inferred after the watchdog closed the socket)."""


class _BodyTooLarge(Exception):
    """A 2xx body beyond :data:`MAX_BODY_BYTES`: not a meter's answer, and not worth asking again."""


def chat_completions_url(base_url: str) -> str:
    """The chat-completions URL of an OpenAI-compatible API given as its root (``http://host:8000/v1``), the server
    (``http://host:8000``: ``/v1`` is added) or the full URL (``.../chat/completions``, used as is)."""
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    try:
        parts = urllib.parse.urlsplit(base_url.strip())
        parts.port  # noqa: B018 - validates the port
    except ValueError as err:
        raise ValueError(f"base_url {base_url!r} is not a valid URL: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials: pass the key as api_key")
    path = parts.path.rstrip("/")
    if not path.endswith(CHAT_PATH):
        if not path.endswith("/v1"):
            path += "/v1"
        path += CHAT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _positive_seconds(value: Any, name: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return seconds


class EndpointMeter:
    """A :class:`~deltattg.meter.base.Meter` that asks a served model for each reading.

    ``base_url`` is the API root (``http://host:8000/v1``; see :func:`chat_completions_url`); ``model`` the served
    model name. Given a ``tokenizer`` (the served model's) and ``max_prompt_tokens``, prompts are fitted to that budget
    here, before sending; ``turn_limit``, the turn limit the served meter was trained under, adds the turns left. ``meter_id`` defaults to the model name, prompt version and budget; pass your own when the
    weights behind a name change, or cached readings will be reused. ``timeout_s`` is the deadline of one reading,
    retries included; the other failure settings are described in the module docstring.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Any = None,
        max_prompt_tokens: int | None = None,
        meter_id: str | None = None,
        max_tokens: int = 32,
        timeout_s: float = 60.0,
        attempt_timeout_s: float | None = None,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        concurrency: int = 8,
        trip_after: int | None = None,
        api_key: str | None = None,
        turn_limit: int | None = None,
    ):
        self.url = chat_completions_url(base_url)
        if concurrency < 1 or max_retries < 0:
            raise ValueError("concurrency must be at least 1 and max_retries non-negative")
        if trip_after is not None and trip_after < 1:
            raise ValueError(f"trip_after must be at least 1, got {trip_after}")
        if not (math.isfinite(backoff_s) and backoff_s >= 0):
            raise ValueError(f"backoff_s must be a non-negative number of seconds, got {backoff_s!r}")
        self.timeout_s = _positive_seconds(timeout_s, "timeout_s (--meter-timeout)")
        self.attempt_timeout_s = None if attempt_timeout_s is None else _positive_seconds(attempt_timeout_s,
                                                                                          "attempt_timeout_s")
        if max_prompt_tokens is not None:
            meter_messages([], tokenizer, max_prompt_tokens)  # no tokenizer, or too small a budget, fails here
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._target = urllib.parse.urlunsplit(("", "", parts.path, parts.query, ""))
        self._proxy = _proxy_for(parts.scheme, self._host)
        self._ssl = ssl.create_default_context() if self._https else None  # shared by the workers (thread-safe)
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.turn_limit = turn_limit  # the episodes' turn limit the served meter was trained under (turns left)
        limit = "" if turn_limit is None else f":turn-limit={turn_limit}"
        self._meter_id = meter_id or (f"endpoint:{model}:prompt-v{PROMPT_VERSION}:max-prompt-tokens={max_prompt_tokens}"
                                      + limit)  # fmt: skip
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.trip_after = trip_after if trip_after is not None else max(concurrency, 4)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.stats = EndpointStats()
        self._lock = threading.Lock()
        self._unanswered = 0  # prefixes in a row without any HTTP answer
        self._closed_until = 0.0  # monotonic time until which no request is sent
        self._last_unanswered: str | None = None

    @property
    def meter_id(self) -> str:
        return self._meter_id

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """One reading per history, in order; ``None`` where the request or the answer failed."""
        payloads = [self._payload(h) for h in histories]  # on this thread: tokenizers are not thread-safe
        results = self._run(payloads)
        self._count(results)
        return [r.reading for r in results]

    def _payload(self, history: list[dict]) -> bytes | None:
        """The request body for one prefix, or ``None`` when its prompt cannot fit the budget."""
        try:
            messages = meter_messages(history, self.tokenizer, self.max_prompt_tokens, self.turn_limit)
        except ValueError as err:
            logger.debug("no prompt for a prefix: %s", err)
            return None
        request = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        return json.dumps(request).encode()

    # ---- the worker pool ----------------------------------------------------------------------------------------

    def _run(self, payloads: list[bytes | None]) -> list[_Result]:
        """``_read`` of every payload on at most ``concurrency`` daemon threads. The caller's thread only waits, in
        short interruptible slices: a ``KeyboardInterrupt`` leaves at once, and the workers stop taking new prefixes
        (those in flight run out at their deadline; as daemon threads they never hold up the interpreter's exit)."""
        n = len(payloads)
        results: list[_Result | None] = [None] * n
        if n == 0:
            return []
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(n):
            todo.put(i)
        done: queue.Queue[tuple[int, _Result | BaseException]] = queue.Queue()
        stop = threading.Event()
        lock = threading.Lock()
        started: dict[int, float] = {}
        abandoned: set[int] = set()

        def worker() -> None:
            while not stop.is_set():
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    started[i] = time.monotonic()
                try:
                    result: _Result | BaseException = self._read(payloads[i], stop)
                except BaseException as err:  # a bug: handed to the caller's thread
                    result = err
                done.put((i, result))
                with lock:
                    if i in abandoned:  # a replacement took this worker's place
                        return

        def spawn() -> None:
            threading.Thread(target=worker, name="deltattg-meter-endpoint", daemon=True).start()

        for _ in range(min(self.concurrency, n)):
            spawn()
        pending = n
        try:
            while pending:
                try:
                    i, result = done.get(timeout=_POLL_S)
                except queue.Empty:
                    pending -= self._abandon_late(results, started, abandoned, lock, spawn)
                    continue
                if isinstance(result, BaseException):
                    raise result
                if results[i] is None:
                    results[i] = result
                    pending -= 1
        finally:
            stop.set()
        return results  # type: ignore[return-value]

    def _abandon_late(self, results, started, abandoned, lock, spawn) -> int:
        """Settle requests whose worker is stuck past the deadline (somewhere no socket timeout reaches, such as name
        resolution) as failures and replace their workers; the number settled."""
        now = time.monotonic()
        with lock:
            late = [i for i, t0 in started.items()
                    if results[i] is None and i not in abandoned and now > t0 + self.timeout_s + _GRACE_S]
            abandoned.update(late)
        for i in late:
            error = f"no answer from {self.url} within the {self.timeout_s:g} s deadline (request abandoned)"
            results[i] = _Result(None, 1, "failure", error, answered=False)
            self._note_answered(False, error)
            spawn()
        return len(late)

    # ---- one prefix ---------------------------------------------------------------------------------------------

    def _read(self, payload: bytes | None, stop: threading.Event | None = None) -> _Result:
        if payload is None:
            return _Result(None, 0, "failure", "the prompt does not fit max_prompt_tokens")
        closed = self._closed_reason()
        if closed is not None:
            return _Result(None, 0, "failure", closed, answered=False, skipped=True)
        body, attempts, error, answered = self._post(payload, stop)
        self._note_answered(answered, error)
        if body is None:
            return _Result(None, attempts, "failure", error, answered=answered)
        text = completion_text(body)
        if text is None:
            error = f"HTTP 200 from {self.url} is not a chat completion: {_snippet(body)}"
            return _Result(None, attempts, "failure", error)
        reading = parse_answer(text)
        if reading is None:
            return _Result(None, attempts, "invalid", f"not a meter answer: {text[:_SNIPPET_CHARS]!r}")
        return _Result(reading, attempts, "ok")

    def _post(self, payload: bytes, stop: threading.Event | None = None) -> tuple[bytes | None, int, str | None, bool]:
        """``(2xx body or None, attempts made, the last error, whether any HTTP answer came)``, with bounded retries on
        transient failures, all within one deadline of ``timeout_s``."""
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
                return result.body, attempts, None, True
            logger.debug("%s (attempt %d)", result.error, attempts)
            if not result.retry or attempts > self.max_retries:
                return None, attempts, result.error, answered
            wait = self.backoff_s * 2 ** (attempts - 1)
            if time.monotonic() + wait >= deadline:
                return None, attempts, result.error, answered
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):  # the caller left (Ctrl-C): no more attempts
                return None, attempts, result.error, answered

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
                return _Attempt(_read_body(conn, response, until, MAX_BODY_BYTES, strict=True))
            detail = _snippet(_read_body(conn, response, until, 4 * _SNIPPET_CHARS, strict=False))
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
            return _Attempt(None, f"HTTP {status} from {self.url}: a body over {MAX_BODY_BYTES} bytes is not a "
                            "chat completion")
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

    # ---- the circuit breaker and the counts ---------------------------------------------------------------------

    def _closed_reason(self) -> str | None:
        with self._lock:
            left = self._closed_until - time.monotonic()
            if left <= 0:
                return None
            return (f"not sent: {self._unanswered} requests in a row to {self.url} got no answer "
                    f"(last: {self._last_unanswered}); trying again in {left:.0f} s")

    def _note_answered(self, answered: bool, error: str | None) -> None:
        with self._lock:
            if answered:
                self._unanswered = 0
                self._closed_until = 0.0
                return
            self._unanswered += 1
            self._last_unanswered = error
            if self._unanswered >= self.trip_after:
                self._closed_until = time.monotonic() + self.timeout_s

    def _count(self, results: list[_Result]) -> None:
        stats = self.stats
        stats.prefixes += len(results)
        stats.requests += sum(r.attempts for r in results)
        stats.retries += sum(max(r.attempts - 1, 0) for r in results)
        failures = sum(r.outcome == "failure" for r in results)
        invalid = sum(r.outcome == "invalid" for r in results)
        skipped = sum(r.skipped for r in results)
        stats.failures += failures
        stats.invalid_answers += invalid
        stats.skipped += skipped
        sent_errors = [r.error for r in results if r.error is not None and not r.skipped]
        unsent_errors = [r.error for r in results if r.error is not None and r.skipped]
        errors = Counter(sent_errors or unsent_errors[:1])  # why the skipped ones were not sent: said once
        if sent_errors:
            stats.last_error = sent_errors[-1]
        elif unsent_errors and stats.last_error is None:
            stats.last_error = unsent_errors[-1]
        if failures or invalid:
            shown = "; ".join(f"{error} (×{k})" if k > 1 else error for error, k in errors.most_common(3))
            more = f"; and {len(errors) - 3} other errors" if len(errors) > 3 else ""
            unsent = f", {skipped} not sent (endpoint not answering)" if skipped else ""
            logger.warning(
                "meter endpoint %s: %d of %d prefixes failed%s, %d gave invalid answers%s",
                self.url,
                failures,
                len(results),
                unsent,
                invalid,
                f": {shown}{more}" if shown else "",
            )


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


def _snippet(body: bytes) -> str:
    text = " ".join(body.decode("utf-8", "replace").split())
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 1] + "…"


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt: request timeout, rate limit or a server error."""
    return status in (408, 429) or 500 <= status <= 599


def completion_text(body: bytes) -> str | None:
    """The first choice's message content of a chat-completion response body, or ``None`` for anything else."""
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return None
    return content if isinstance(content, str) else None
