"""A progress meter served behind an OpenAI-compatible endpoint (vLLM, SGLang: ``POST {base}/v1/chat/completions``).

Each decision prefix becomes one chat-completion request with the meter prompt (:mod:`deltattg.meter.prompt`),
greedy decoding (``temperature`` 0) and a small ``max_tokens``; requests of a batch run concurrently on at most
``concurrency`` worker threads.

Failure behaviour, all of it bounded:

* **One deadline per reading, bounded retries, no redirects**: each request is a
  :class:`~deltattg.deadline_post.DeadlinePost` with ``timeout_s`` (the CLI's ``--meter-timeout``, default 60 s)
  bounding everything one prefix may cost (connecting, a body that trickles in, every retry and backoff); a
  connection error, a timed-out attempt, HTTP 408/429 or 5xx is retried at most ``max_retries`` times; a 3xx is a
  failed reading naming the status, the URL and the ``Location`` (so ``Authorization`` only goes to the origin given).
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
``/chat/completions`` is used as is. Standard library only; proxies come from the usual environment variables.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from deltattg.data.trajectory import MeterOutput
from deltattg.deadline_post import SNIPPET_CHARS, DeadlinePost, http_url_parts, snippet
from deltattg.meter.answer import parse_answer
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages

logger = logging.getLogger(__name__)

Outcome = Literal["ok", "failure", "invalid"]

CHAT_PATH = "/chat/completions"
MAX_BODY_BYTES = 1 << 20  # a chat completion of a few dozen tokens is well under this
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


def chat_completions_url(base_url: str) -> str:
    """The chat-completions URL of an OpenAI-compatible API given as its root (``http://host:8000/v1``), the server
    (``http://host:8000``: ``/v1`` is added) or the full URL (``.../chat/completions``, used as is)."""
    parts = http_url_parts(base_url, "base_url")
    path = parts.path.rstrip("/")
    if not path.endswith(CHAT_PATH):
        if not path.endswith("/v1"):
            path += "/v1"
        path += CHAT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


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
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if trip_after is not None and trip_after < 1:
            raise ValueError(f"trip_after must be at least 1, got {trip_after}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._post = DeadlinePost(chat_completions_url(base_url), timeout_s=timeout_s,
                                  attempt_timeout_s=attempt_timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                  max_body_bytes=MAX_BODY_BYTES, headers=headers,
                                  timeout_name="timeout_s (--meter-timeout)")
        self.url = self._post.url
        self.timeout_s = self._post.timeout_s
        if max_prompt_tokens is not None:
            meter_messages([], tokenizer, max_prompt_tokens)  # no tokenizer, or too small a budget, fails here
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.turn_limit = turn_limit  # the episodes' turn limit the served meter was trained under (turns left)
        limit = "" if turn_limit is None else f":turn-limit={turn_limit}"
        self._meter_id = meter_id or (f"endpoint:{model}:prompt-v{PROMPT_VERSION}:max-prompt-tokens={max_prompt_tokens}"
                                      + limit)  # fmt: skip
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.trip_after = trip_after if trip_after is not None else max(concurrency, 4)
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
        answer = self._post.send(payload, stop)
        self._note_answered(answer.answered, answer.error)
        if answer.body is None:
            return _Result(None, answer.attempts, "failure", answer.error, answered=answer.answered)
        text = completion_text(answer.body)
        if text is None:
            error = f"HTTP 200 from {self.url} is not a chat completion: {snippet(answer.body)}"
            return _Result(None, answer.attempts, "failure", error)
        reading = parse_answer(text)
        if reading is None:
            return _Result(None, answer.attempts, "invalid", f"not a meter answer: {text[:SNIPPET_CHARS]!r}")
        return _Result(reading, answer.attempts, "ok")

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


def completion_text(body: bytes) -> str | None:
    """The first choice's message content of a chat-completion response body, or ``None`` for anything else."""
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return None
    return content if isinstance(content, str) else None
