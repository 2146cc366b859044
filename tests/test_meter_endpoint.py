"""The endpoint client against a real OpenAI-compatible HTTP server on loopback that misbehaves on request."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
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
from deltattg.cli import main
from deltattg.meter.endpoint import EndpointMeter, EndpointStats, chat_completions_url
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages, render_prompt

TIMEOUT_S = 0.5  # one attempt (attempt_timeout_s) in the retry tests
HANG_S = 3 * TIMEOUT_S
DEADLINE_S = 1.0  # the whole-reading deadline (timeout_s) in the deadline tests
SLACK_S = 1.0  # scheduling slack on a loaded machine
TRICKLE_S = 0.25  # one byte per this many seconds
CHAT_PATH = "/v1/chat/completions"


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
        self.force: str | None = None  # while set, every request is answered as this case
        self.redirect_to: str | None = None  # where case "redirect" sends the client
        self.seen: list[tuple[str, str, dict]] = []  # (method, path, headers) of every request, whatever it was
        self.release = threading.Event()  # ends the hanging and trickling answers (set at teardown)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request, client_address) -> None:  # a client that timed out and left: expected here
        pass


class Handler(BaseHTTPRequestHandler):
    server: FakeMeterServer

    def log_message(self, format, *args) -> None:
        pass

    def do_GET(self) -> None:  # what a client that turned a redirected POST into a GET would send: a valid answer
        with self.server.lock:
            self.server.seen.append(("GET", self.path, dict(self.headers)))
        choice = {"index": 0, "message": {"content": format_answer(True, 1)}}
        self.send(200, json.dumps({"object": "chat.completion", "choices": [choice]}).encode())

    def do_POST(self) -> None:
        fake = self.server
        with fake.lock:
            fake.seen.append(("POST", self.path, dict(self.headers)))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != CHAT_PATH:  # as vLLM's FastAPI answers an unknown route
            return self.send(404, b'{"detail": "Not Found"}')
        case, answer = re.search(r"case=(\S+) answer=(\d+)", body["messages"][-1]["content"]).groups()
        with fake.lock:
            fake.attempts[case] += 1  # counted under the prompt's case, answered as the forced one if any
            attempt = fake.attempts[case]
            fake.requests.append((dict(self.headers), body))
        self.reply(fake.force or case, int(answer), attempt, fake.broken)

    def work(self, seconds: float) -> None:
        """The server's work on one request, counted in flight. Counting ends before the answer is written: a client
        that has read it may send its next request before this thread would count down, which a busy machine shows
        as one request too many."""
        fake = self.server
        with fake.lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            time.sleep(seconds)
        finally:
            with fake.lock:
                fake.in_flight -= 1

    def reply(self, case: str, answer: int, attempt: int, broken: bool) -> None:
        if broken or case == "e500" or (case == "e500-then-ok" and attempt == 1):
            return self.send(500 if not broken else 503, b'{"error": "overloaded"}')
        if case == "e400":
            return self.send(400, b'{"error": "prompt too long"}')
        if case == "hang":
            self.server.release.wait(30)
            return
        if case == "redirect":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if case == "trickle-body":  # a complete status line and headers, then the body one byte at a time
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            return self.trickle(b" " * 1000)
        if case == "trickle-head":  # the status line, then the headers one byte at a time
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            return self.trickle(b"X-Slow: " + b"a" * 1000 + b"\r\n\r\n")
        if case == "slow" or (case == "slow-then-ok" and attempt == 1):
            time.sleep(HANG_S)
        if case == "drop-then-ok" and attempt == 1:
            return  # close the connection without a word
        if case == "delay":
            self.work(answer / 1000)
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

    def trickle(self, data: bytes) -> None:
        for k in range(len(data)):
            if self.server.release.wait(TRICKLE_S):
                return
            try:
                self.wfile.write(data[k : k + 1])
            except OSError:  # the client gave up
                return

    def send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextlib.contextmanager
def serving() -> Iterator[FakeMeterServer]:
    """A fake meter server on a free loopback port, serving in a thread until the block ends."""
    fake = FakeMeterServer()
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        fake.shutdown()
        fake.server_close()


@pytest.fixture
def server() -> Iterator[FakeMeterServer]:
    with serving() as fake:
        yield fake


@pytest.fixture
def other_server() -> Iterator[FakeMeterServer]:
    """A second server on another port: another origin."""
    with serving() as fake:
        yield fake


def prefix(case: str, answer: int = 0) -> list[dict]:
    """A decision prefix that asks the fake server for behaviour ``case`` and, when it answers, ``answer`` tokens."""
    task = f"Task: case={case} answer={answer}"
    return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]


def client(server: FakeMeterServer, **kwargs) -> EndpointMeter:
    options = {"timeout_s": 4 * HANG_S, "attempt_timeout_s": TIMEOUT_S, "max_retries": 2, "backoff_s": 0.01,
               "concurrency": 4, **kwargs}
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


# ---- one deadline per reading (issue 10, item 3) -------------------------------------------------------------------


def deadline_client(server: FakeMeterServer, **kwargs) -> EndpointMeter:
    options = {"timeout_s": DEADLINE_S, "max_retries": 2, "backoff_s": 0.01, "concurrency": 4, **kwargs}
    return EndpointMeter(server.base_url, "meter-model", **options)


@pytest.mark.parametrize("case", ["hang", "trickle-body", "trickle-head"])
def test_a_reading_never_outlives_its_deadline(server, case, caplog):
    """A server that never answers, or answers one byte every 0.25 s (body or headers), costs one deadline — not a
    socket timeout per read, nor one per retry."""
    meter = deadline_client(server)
    started = time.monotonic()
    assert meter.score([prefix(case, 1), prefix(case, 2)]) == [None, None]
    elapsed = time.monotonic() - started
    assert DEADLINE_S - 0.05 <= elapsed < DEADLINE_S + SLACK_S
    assert server.attempts[case] == 2  # one attempt each: no time was left to retry
    assert meter.stats.failures == 2
    assert f"within the {DEADLINE_S:g} s deadline" in meter.stats.last_error
    assert server.base_url + "/chat/completions" in meter.stats.last_error
    assert f"meter endpoint {server.base_url}/chat/completions: 2 of 2 prefixes failed" in caplog.text


def test_retries_and_backoff_stay_inside_the_deadline(server):
    server.force = "e500"
    meter = deadline_client(server, max_retries=10, backoff_s=0.3)  # 0.3 + 0.6 s of backoff, then 1.2 s: too long
    started = time.monotonic()
    assert meter.score([prefix("x")]) == [None]
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert server.attempts["x"] == 3
    assert meter.stats.last_error.startswith(f"HTTP 500 Internal Server Error from {server.base_url}/chat/completions")


def test_a_dead_endpoint_is_not_waited_on_for_every_prefix(server):
    """After a wave of unanswered requests the rest of the batch fails at once; a deadline later it is tried again."""
    server.force = "hang"
    meter = deadline_client(server, concurrency=1, trip_after=2)  # one at a time: deterministic
    started = time.monotonic()
    assert meter.score([prefix("x", k) for k in range(12)]) == [None] * 12
    assert time.monotonic() - started < 2 * DEADLINE_S + SLACK_S  # two deadlines, not twelve
    assert server.attempts["x"] == 2
    assert meter.stats.failures == 12 and meter.stats.skipped == 10
    assert meter.stats.last_error.startswith(f"no complete answer from {server.base_url}/chat/completions")
    server.force = None
    assert meter.score([prefix("ok", 3)]) == [None]  # still closed: not sent
    time.sleep(DEADLINE_S)
    assert meter.score([prefix("ok", 3)]) == [MeterOutput(True, 3)]  # tried again, and it answers
    assert meter.score([prefix("ok", 4), prefix("ok", 5)]) == [MeterOutput(True, 4), MeterOutput(True, 5)]


def test_a_keyboard_interrupt_leaves_a_wave_at_once(server):
    server.force = "hang"
    meter = deadline_client(server, timeout_s=20)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            meter.score([prefix("x", k) for k in range(6)])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 0.3 + SLACK_S


# ---- redirects (item 4) --------------------------------------------------------------------------------------------


def test_a_redirect_to_another_origin_is_not_followed(server, other_server, caplog):
    server.force = "redirect"
    server.redirect_to = other_server.base_url + "/chat/completions"
    meter = deadline_client(server, api_key="secret")
    assert meter.score([prefix("x")]) == [None]
    assert other_server.seen == []  # neither the request nor the key went there
    assert server.attempts["x"] == 1  # a redirect is final, not retried
    assert "Bearer secret" in str(server.seen[0][2])
    assert (f"HTTP 302 Found from {server.base_url}/chat/completions: redirect to another origin to "
            f"{other_server.base_url}/chat/completions not followed") in caplog.text


def test_a_same_origin_redirect_is_not_followed_either(server):
    server.force = "redirect"
    server.redirect_to = "/v2/chat/completions"
    meter = deadline_client(server)
    assert meter.score([prefix("x")]) == [None]
    assert [(method, path) for method, path, _ in server.seen] == [("POST", CHAT_PATH)]
    assert f"redirect to http://127.0.0.1:{server.server_address[1]}/v2/chat/completions not followed" in (
        meter.stats.last_error)


# ---- the OpenAI base-URL convention and the warnings (item 5) -------------------------------------------------------


def test_the_base_url_is_accepted_with_or_without_v1(server):
    root = f"http://127.0.0.1:{server.server_address[1]}"
    bases = [root, root + "/", root + "/v1", root + "/v1/", root + "/v1/chat/completions"]
    for k, base in enumerate(bases):
        meter = EndpointMeter(base, "meter-model", timeout_s=DEADLINE_S)
        assert meter.url == root + CHAT_PATH
        assert meter.score([prefix("ok", k)]) == [MeterOutput(True, k)]
    assert [path for _, path, _ in server.seen] == [CHAT_PATH] * len(bases)


def test_chat_completions_url():
    assert chat_completions_url("https://api.example.com/openai/v1?x=1") == (
        "https://api.example.com/openai/v1/chat/completions?x=1")
    assert chat_completions_url("http://h:8000/proxy") == "http://h:8000/proxy/v1/chat/completions"
    for bad in ["h:8000/v1", "ftp://h/v1", "http:///v1", "http://h:99999/v1", "http://user:key@h/v1"]:
        with pytest.raises(ValueError):
            chat_completions_url(bad)
    for bad in [0, -1, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="timeout_s"):
            EndpointMeter("http://h/v1", "m", timeout_s=bad)


def test_an_http_error_is_warned_with_its_status_and_url(server, caplog):
    wrong = f"http://127.0.0.1:{server.server_address[1]}/api"  # -> /api/v1/chat/completions: not served
    meter = EndpointMeter(wrong, "meter-model", timeout_s=DEADLINE_S)
    with caplog.at_level(logging.WARNING, logger="deltattg.meter.endpoint"):
        assert meter.score([prefix("ok", 1), prefix("ok", 2)]) == [None, None]
    expected = f"HTTP 404 Not Found from {wrong}/v1/chat/completions: {{\"detail\": \"Not Found\"}} (×2)"
    assert expected in caplog.text
    assert meter.stats.requests == 2  # a 404 is not retried


# ---- the command line: --meter-timeout, exit 3, Ctrl-C ------------------------------------------------------------


def scoring_input(tmp_path, cases: list[str]):
    records = []
    for k, case in enumerate(cases):
        messages = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": f"Task: case={case} answer={k + 1}"},
                    {"role": "assistant", "content": "go to the mug"}]
        records.append({"id": f"t{k}", "group": "g", "reward": float(k % 2), "success": bool(k % 2),
                        "messages": messages, "step_tokens": [4]})
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def score_argv(src, out, url: str, *extra: str) -> list[str]:
    return ["score", str(src), "--out", str(out), "--meter", url, "--meter-model", "m", "--no-progress", *extra]


def test_score_reports_the_invalid_count(server, tmp_path, capsys):
    src, out = scoring_input(tmp_path, ["ok", "e400", "ok"]), tmp_path / "scored.jsonl"
    assert main(score_argv(src, out, server.base_url, "--meter-timeout", "2")) == 0
    assert [json.loads(line)["meter"] for line in out.read_text().splitlines()] == [
        [{"can_complete": True, "tokens_to_go": 1}], [None], [{"can_complete": True, "tokens_to_go": 3}]]
    assert "(1 of 3 readings null)" in capsys.readouterr().err


def test_score_exits_3_and_writes_nothing_when_no_reading_is_valid(server, tmp_path, capsys):
    src, out = scoring_input(tmp_path, ["ok", "ok"]), tmp_path / "scored.jsonl"
    wrong = f"http://127.0.0.1:{server.server_address[1]}/api"
    assert main(score_argv(src, out, wrong, "--meter-timeout", "2")) == 3
    err = capsys.readouterr().err
    assert ("no valid reading: every one of 2 readings was null (last error: HTTP 404 Not Found from "
            f"{wrong}/v1/chat/completions") in err
    assert list(tmp_path.iterdir()) == [src]  # no output, no temporary file


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_bad_meter_timeout_is_a_usage_error(server, tmp_path, value, capsys):
    src, out = scoring_input(tmp_path, ["ok"]), tmp_path / "scored.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(score_argv(src, out, server.base_url, "--meter-timeout", value))
    assert exit_.value.code == 2 and "--meter-timeout" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_ends_score_at_once_with_130_and_no_output(server, tmp_path):
    server.force = "hang"
    src, out = scoring_input(tmp_path, ["x"] * 6), tmp_path / "scored.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A shell's background job starts with SIGINT ignored, and a child inherits that (Python then installs no
    # KeyboardInterrupt handler): give the command the default disposition a terminal's foreground job has.
    process = subprocess.Popen([sys.executable, "-m", "deltattg", *score_argv(src, out, server.base_url,
                                "--meter-timeout", "60")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        waited = time.monotonic()
        while server.attempts["x"] < 1:  # the wave is in flight
            assert process.poll() is None, process.communicate()
            assert time.monotonic() - waited < 120, "the command never reached the server"
            time.sleep(0.05)
        time.sleep(0.2)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
        assert time.monotonic() - interrupted < 3
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert list(tmp_path.iterdir()) == [src]


def test_a_request_stuck_where_no_socket_timeout_reaches_is_abandoned_at_the_deadline(monkeypatch):
    """Name resolution takes no timeout: the caller's thread settles such a request itself, a moment after its
    deadline, and moves on."""
    resolve = socket.getaddrinfo

    def slow_getaddrinfo(host, *args, **kwargs):
        if host == "slow-dns.invalid":
            time.sleep(5)
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    meter = EndpointMeter("http://slow-dns.invalid/v1", "m", timeout_s=0.5)
    started = time.monotonic()
    assert meter.score([prefix("x")]) == [None]
    assert time.monotonic() - started < 0.5 + 1.0 + SLACK_S
    assert "(request abandoned)" in meter.stats.last_error


def test_a_proxy_from_the_environment_is_used(server, monkeypatch):
    """``http_proxy`` is honoured as urllib does (here the fake server plays the proxy and sees the absolute URL)."""
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://user:pw@127.0.0.1:{server.server_address[1]}")
    meter = EndpointMeter("http://meter.invalid:8000/v1", "m", timeout_s=DEADLINE_S)
    assert meter.score([prefix("ok", 2)]) == [None]  # the "proxy" does not serve that path: a 404
    [(method, path, headers)] = server.seen
    assert (method, path) == ("POST", "http://meter.invalid:8000/v1/chat/completions")
    assert headers["Host"] == "meter.invalid:8000" and headers["Proxy-Authorization"] == "Basic dXNlcjpwdw=="
    monkeypatch.setenv("no_proxy", "meter.invalid")
    assert EndpointMeter("http://meter.invalid:8000/v1", "m")._post._proxy is None
