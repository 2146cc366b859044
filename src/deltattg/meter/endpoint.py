"""A progress meter served behind an OpenAI-compatible endpoint (vLLM, SGLang: ``POST {base_url}/chat/completions``).

Each decision prefix becomes one chat-completion request with the meter prompt (:mod:`deltattg.meter.prompt`),
greedy decoding (``temperature`` 0) and a small ``max_tokens``; requests of a batch run concurrently on at most
``concurrency`` threads. A request that fails with a connection error, a timeout (``timeout_s`` per socket
operation), HTTP 408/429 or 5xx is retried up to ``max_retries`` times after ``backoff_s``·2^k seconds. Whatever
still fails — and any other HTTP error, a body that is not a chat completion, or an answer
:func:`~deltattg.meter.answer.parse_answer` rejects — is an invalid reading (``None``) for that prefix, counted in
:class:`EndpointStats` and never raised, so Algorithm 1 falls back for that group and training goes on.

Standard library only (``urllib``); proxies come from the usual environment variables.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from deltattg.data.trajectory import MeterOutput
from deltattg.meter.answer import parse_answer
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages

logger = logging.getLogger(__name__)

Outcome = Literal["ok", "failure", "invalid"]


@dataclass
class EndpointStats:
    """Running counts of an :class:`EndpointMeter`."""

    prefixes: int = 0  # decision prefixes asked for
    requests: int = 0  # HTTP requests sent, retries included
    retries: int = 0  # requests that repeated a failed one
    failures: int = 0  # prefixes without a usable completion: no request possible, or every attempt failed
    invalid_answers: int = 0  # prefixes whose completion arrived but did not parse as an answer


@dataclass(frozen=True)
class _Result:
    """What one prefix's requests came to (built on a worker thread, counted on the caller's)."""

    reading: MeterOutput | None
    attempts: int
    outcome: Outcome


class EndpointMeter:
    """A :class:`~deltattg.meter.base.Meter` that asks a served model for each reading.

    ``base_url`` is the API root (``http://host:8000/v1``); ``model`` the served model name. Given a ``tokenizer``
    (the served model's) and ``max_prompt_tokens``, prompts are fitted to that budget here, before sending.
    ``meter_id`` defaults to the model name, prompt version and budget; pass your own when the weights behind a
    name change, or cached readings will be reused.
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
        max_retries: int = 2,
        backoff_s: float = 0.5,
        concurrency: int = 8,
        api_key: str | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if concurrency < 1 or max_retries < 0:
            raise ValueError("concurrency must be at least 1 and max_retries non-negative")
        if max_prompt_tokens is not None:
            meter_messages([], tokenizer, max_prompt_tokens)  # no tokenizer, or too small a budget, fails here
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self._meter_id = meter_id or f"endpoint:{model}:prompt-v{PROMPT_VERSION}:max-prompt-tokens={max_prompt_tokens}"
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.stats = EndpointStats()

    @property
    def meter_id(self) -> str:
        return self._meter_id

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """One reading per history, in order; ``None`` where the request or the answer failed."""
        payloads = [self._payload(h) for h in histories]  # on this thread: tokenizers are not thread-safe
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            results = list(pool.map(self._read, payloads))
        self._count(results)
        return [r.reading for r in results]

    def _payload(self, history: list[dict]) -> bytes | None:
        """The request body for one prefix, or ``None`` when its prompt cannot fit the budget."""
        try:
            messages = meter_messages(history, self.tokenizer, self.max_prompt_tokens)
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

    def _read(self, payload: bytes | None) -> _Result:
        if payload is None:
            return _Result(None, 0, "failure")
        body, attempts = self._post(payload)
        text = None if body is None else completion_text(body)
        if text is None:
            return _Result(None, attempts, "failure")
        reading = parse_answer(text)
        return _Result(reading, attempts, "ok" if reading is not None else "invalid")

    def _post(self, payload: bytes) -> tuple[bytes | None, int]:
        """``(response body or None, attempts made)`` with bounded retries on transient failures."""
        request = urllib.request.Request(self.url, data=payload, headers=self.headers, method="POST")
        attempts = 0
        while True:
            attempts += 1
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return response.read(), attempts
            except urllib.error.HTTPError as err:
                err.close()
                retry = is_retryable_status(err.code)
                logger.debug("HTTP %d from %s (attempt %d)", err.code, self.url, attempts)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, bad status line
                retry = True
                logger.debug("%s from %s (attempt %d)", err, self.url, attempts)
            if not retry or attempts > self.max_retries:
                return None, attempts
            time.sleep(self.backoff_s * 2 ** (attempts - 1))

    def _count(self, results: list[_Result]) -> None:
        stats = self.stats
        stats.prefixes += len(results)
        stats.requests += sum(r.attempts for r in results)
        stats.retries += sum(max(r.attempts - 1, 0) for r in results)
        failures = sum(r.outcome == "failure" for r in results)
        invalid = sum(r.outcome == "invalid" for r in results)
        stats.failures += failures
        stats.invalid_answers += invalid
        if failures or invalid:
            logger.warning(
                "meter endpoint %s: %d of %d prefixes failed, %d gave invalid answers",
                self.url,
                failures,
                len(results),
                invalid,
            )


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
