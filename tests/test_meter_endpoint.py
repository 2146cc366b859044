"""The endpoint client against a real OpenAI-compatible HTTP server on loopback that misbehaves on request."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deltattg.data.trajectory import MeterOutput
from deltattg.meter.answer import format_answer
from deltattg.meter.base import CachedMeter
from deltattg.meter.cache import ScoreCache
from deltattg.meter.endpoint import EndpointMeter, EndpointStats
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages, render_prompt

TIMEOUT_S = 0.5
HANG_S = 3 * TIMEOUT_S


class FakeMeterServer(ThreadingHTTPServer):
    """``POST /v1/chat/completions`` whose reply is chosen by ``case=KIND answer=N`` in the prompt (see ``reply``)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()
        self.requests: list[tuple[dict, dict]] = []  # (headers, JSON body)
        self.in_flight = self.max_in_flight = 0
        self.broken = False  # while set, every request gets a 503

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request, client_address) -> None:  # a client that timed out and left: expected here
        pass


class Handler(BaseHTTPRequestHandler):
    server: FakeMeterServer

    def log_message(self, format, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        case, answer = re.search(r"case=(\S+) answer=(\d+)", body["messages"][-1]["content"]).groups()
        fake = self.server
        with fake.lock:
            fake.attempts[case] += 1
            attempt = fake.attempts[case]
            fake.requests.append((dict(self.headers), body))
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            self.reply(case, int(answer), attempt, fake.broken)
        finally:
            with fake.lock:
                fake.in_flight -= 1

    def reply(self, case: str, answer: int, attempt: int, broken: bool) -> None:
        if broken or case == "e500" or (case == "e500-then-ok" and attempt == 1):
            return self.send(500 if not broken else 503, b'{"error": "overloaded"}')
        if case == "e400":
            return self.send(400, b'{"error": "prompt too long"}')
        if case == "slow" or (case == "slow-then-ok" and attempt == 1):
            time.sleep(HANG_S)
        if case == "drop-then-ok" and attempt == 1:
            return  # close the connection without a word
        if case == "delay":
            time.sleep(answer / 1000)
        if case == "garbage":
            return self.send(200, b"<html>502 Bad Gateway</html>")
        if case == "no-choices":
            return self.send(200, b'{"object": "error", "message": "model not found"}')
        content = {
            "fail": format_answer(False, None),
            "wrong": "It will take about 400 more tokens.",
            "fenced": "```json\n" + format_answer(True, 5) + "\n```",
        }.get(case, format_answer(True, answer))
        completion = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": content}}]}
        self.send(200, json.dumps(completion).encode())

    def send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server() -> Iterator[FakeMeterServer]:
    fake = FakeMeterServer()
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield fake
    fake.shutdown()
    fake.server_close()


def prefix(case: str, answer: int = 0) -> list[dict]:
    """A decision prefix that asks the fake server for behaviour ``case`` and, when it answers, ``answer`` tokens."""
    task = f"Task: case={case} answer={answer}"
    return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]


def client(server: FakeMeterServer, **kwargs) -> EndpointMeter:
    options = {"timeout_s": TIMEOUT_S, "max_retries": 2, "backoff_s": 0.01, "concurrency": 4, **kwargs}
    return EndpointMeter(server.base_url, "meter-model", **options)


def test_every_failure_becomes_an_invalid_reading_and_is_counted(server):
    expected = {  # case: (reading, attempts)
        "ok": (MeterOutput(True, 412), 1),
        "fail": (MeterOutput(False, None), 1),
        "e500-then-ok": (MeterOutput(True, 7), 2),  # retried after a 500, then answered
        "slow-then-ok": (MeterOutput(True, 9), 2),  # retried after a timeout
        "drop-then-ok": (MeterOutput(True, 11), 2),  # retried after a dropped connection
        "e500": (None, 3),  # retries exhausted
        "slow": (None, 3),
        "e400": (None, 1),  # a client error is not retried
        "garbage": (None, 1),  # a 200 that is not a chat completion
        "no-choices": (None, 1),
        "wrong": (None, 1),  # a completion, but not an answer
        "fenced": (None, 1),
    }
    meter = client(server)
    started = time.monotonic()
    answers = {"ok": 412, "e500-then-ok": 7, "slow-then-ok": 9, "drop-then-ok": 11}
    readings = meter.score([prefix(case, answers.get(case, 0)) for case in expected])
    elapsed = time.monotonic() - started

    assert readings == [reading for reading, _ in expected.values()]
    assert server.attempts == {case: attempts for case, (_, attempts) in expected.items()}
    assert meter.stats == EndpointStats(prefixes=12, requests=19, retries=7, failures=5, invalid_answers=2)
    assert elapsed < 3 * TIMEOUT_S + HANG_S  # the hung requests were abandoned at the timeout, not awaited


def test_requests_are_greedy_small_and_carry_the_meter_prompt(server):
    history = prefix("ok", 3) + [{"role": "assistant", "content": "searching"}]
    EndpointMeter(server.base_url, "meter-model", max_tokens=24, api_key="secret").score([history])
    [(headers, body)] = server.requests
    assert body == {"model": "meter-model", "messages": meter_messages(history), "temperature": 0, "max_tokens": 24}
    assert headers["Authorization"] == "Bearer secret"


class ByteTokenizer:
    """A real (if trivial) tokenizer: one token per UTF-8 byte, no chat template."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode())}


def test_prompts_are_fitted_to_the_budget_before_sending(server):
    history = prefix("ok", 1) + [{"role": "assistant", "content": "x" * 5000}, {"role": "tool", "content": "y"}]
    tokenizer = ByteTokenizer()
    meter = client(server, tokenizer=tokenizer, max_prompt_tokens=2000)
    assert meter.score([history]) == [MeterOutput(True, 1)]
    [(_, body)] = server.requests
    assert len(render_prompt(body["messages"], tokenizer).encode()) <= 2000
    assert "1 earlier turn omitted" in body["messages"][0]["content"]
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        client(server, tokenizer=tokenizer, max_prompt_tokens=100)  # not even the instruction fits


def test_concurrency_is_bounded(server):
    meter = client(server, concurrency=3)
    delays_ms = [200 + i for i in range(8)]
    assert meter.score([prefix("delay", ms) for ms in delays_ms]) == [MeterOutput(True, ms) for ms in delays_ms]
    assert server.max_in_flight == 3


def test_an_unreachable_endpoint_gives_invalid_readings_after_bounded_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nothing listens there
    meter = EndpointMeter(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_s=0.01, timeout_s=TIMEOUT_S)
    assert meter.score([prefix("a"), prefix("b")]) == [None, None]
    assert meter.stats == EndpointStats(prefixes=2, requests=4, retries=2, failures=2, invalid_answers=0)


def test_failures_are_not_cached_so_a_recovered_server_is_asked_again(server, tmp_path):
    histories = [prefix("ok", 5), prefix("fail")]
    endpoint = client(server, max_retries=0)
    with ScoreCache(tmp_path / "scores.sqlite") as cache:
        meter = CachedMeter(endpoint, cache)
        server.broken = True
        assert meter.score(histories) == [None, None]
        server.broken = False
        assert meter.score(histories) == [MeterOutput(True, 5), MeterOutput(False, None)]
        assert meter.score(histories) == [MeterOutput(True, 5), MeterOutput(False, None)]
    assert endpoint.stats.requests == 4  # two while broken, two after; the third call came from the cache
    assert meter.stats.cache_hits == 2 and meter.stats.invalid == 2


def test_meter_id_names_the_model_and_the_prompt():
    meter = EndpointMeter("http://127.0.0.1:1/v1", "qwen-meter", max_prompt_tokens=None)
    assert meter.meter_id == f"endpoint:qwen-meter:prompt-v{PROMPT_VERSION}:max-prompt-tokens=None"
    assert EndpointMeter("http://127.0.0.1:1/v1", "qwen-meter", meter_id="mine").meter_id == "mine"
    with pytest.raises(ValueError):
        EndpointMeter("127.0.0.1:8000/v1", "qwen-meter")
