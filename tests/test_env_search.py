"""The search environment (Search-R1 / PaperSearchQA setting): answers judged by hand, actions in both forms, the
question and corpus files' bad input, the expert and the mistakes, and retrieval through a real server on loopback
(answers equal the local index's; a dead, hanging or misbehaving server is a failed step, never a hang)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("bm25s", reason="the search environment needs the [search] extra (pip install bm25s)")

from conftest import exit_status  # noqa: E402
from deltattg.cli import main  # noqa: E402
from deltattg.envs.base import Describable, HasExpert, HasMistakes  # noqa: E402
from deltattg.envs.registry import env_factory, rebuild  # noqa: E402
from deltattg.envs.search.answers import exact_match, f1_score, mentions, normalize_answer  # noqa: E402
from deltattg.envs.search.data import read_corpus, read_questions  # noqa: E402
from deltattg.envs.search.env import INVALID, SearchEnv, parse_search_action  # noqa: E402
from deltattg.envs.search.retrieval import BM25Index, RetrievalClient, make_server, retrieve_answer  # noqa: E402
from deltattg.errors import InputError  # noqa: E402

CORPUS = [
    {"id": "p1", "contents": '"Westminster School, Adelaide"\nWestminster School is a boarding school at Marion, South '
                             "Australia, opened by Prime Minister Robert Menzies in 1961."},
    {"id": "p2", "contents": "Marion, South Australia\nMarion is a city in Adelaide founded in 1838."},
    {"id": "p3", "contents": "Melbourne\nMelbourne was founded on 30 August 1835 by free settlers."},
    {"id": "p4", "contents": "Hamlet\nHamlet is a tragedy written by William Shakespeare."},
]
QUESTIONS = [
    {"id": "menzies", "question": "Which city founded in 1838 has a boarding school opened by Robert Menzies?",
     "golden_answers": ["Marion, South Australia", "Marion"], "queries": ["boarding school Robert Menzies"]},
    {"id": "hamlet", "question": "Who wrote the tragedy Hamlet?", "golden_answers": "William Shakespeare"},
    {"id": "melbourne", "question": "When was Melbourne founded?",
     "reward_model": {"ground_truth": {"target": ["30 August 1835"]}}},
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "q").mkdir()
    write_jsonl(tmp_path / "q" / "train.jsonl", QUESTIONS)
    write_jsonl(tmp_path / "q" / "test.jsonl", QUESTIONS[1:])
    return tmp_path / "q", write_jsonl(tmp_path / "corpus.jsonl", CORPUS)


@pytest.fixture()
def env(files):
    questions, corpus = files
    return SearchEnv(questions, corpus=corpus, max_steps=4)



def play(env: SearchEnv, task_id: str, actions: list[str]):
    env.reset(next(t for t in env.tasks("train") if t.id == task_id))
    return [env.step(action) for action in actions]


# ---- answers --------------------------------------------------------------------------------------------------------

def test_answers_are_judged_after_squad_normalisation():
    assert normalize_answer("The  Marion, South-Australia!") == "marion southaustralia"
    assert exact_match("the Marion", ["Marion, South Australia", "Marion"])
    assert not exact_match("Marion South", ["Marion, South Australia", "Marion"])
    # F1 by hand: "marion south" vs "marion south australia": p = 2/2, r = 2/3 -> 0.8
    assert f1_score("Marion South", ["Marion, South Australia"]) == pytest.approx(0.8)
    assert f1_score("", ["x"]) == 0.0
    assert mentions("He was born in Marion, South Australia.", ["Marion, South Australia"])
    assert not mentions("Marionette theatre", ["Marion"])  # a word, not a substring


# ---- actions -------------------------------------------------------------------------------------------------------

def test_actions_in_search_r1_text_and_tool_call_forms():
    assert parse_search_action("<think>hm</think><search> who wrote Hamlet </search>").queries == ("who wrote Hamlet",)
    assert parse_search_action("<answer> Shakespeare </answer> <search>x</search>").answer == "Shakespeare"
    assert parse_search_action("< search > Hamlet < / search >").queries == ("Hamlet",)  # a word-level decoder's
    call = '<tool_call>{"name": "search", "arguments": {"query_list": ["a", "b"]}}</tool_call>'
    assert parse_search_action("Let me look. " + call).queries == ("a", "b")
    assert parse_search_action('{"name": "search", "arguments": "{\\"query\\": \\"c\\"}"}').queries == ("c",)
    assert parse_search_action('{"name": "answer", "arguments": {"answer": "1835"}}').answer == "1835"
    assert parse_search_action("I think it is Marion.").kind == "invalid"
    for reply, why in [("<tool_call>{not json</tool_call>", "malformed tool call"),
                       ('{"name": "lookup", "arguments": {}}', "unknown tool 'lookup'"),
                       ('{"name": "search", "arguments": {"query_list": []}}', "query_list"),
                       ("<search>  </search>", "empty <search>")]:  # fmt: skip
        action = parse_search_action(reply)
        assert action.kind == "invalid" and why in action.error, reply


def test_an_episode_searches_reads_passages_and_is_judged_by_exact_match(env):
    search, answer = play(env, "menzies", ["<search> boarding school Robert Menzies </search>", "<answer> Marion </answer>"])
    assert search.observation.startswith('<information>Doc 1(Title: "Westminster School, Adelaide") Westminster')
    assert search.info["verified"] and search.info["passages"][0] == "p1" and not search.done
    assert answer.done and answer.reward == 1.0 and answer.won and answer.info["f1"] == 1.0
    [wrong] = play(env, "hamlet", ["<answer> Christopher Marlowe </answer>"])
    assert wrong.done and wrong.reward == 0.0 and not wrong.won and wrong.info["em"] is False


def test_invalid_steps_and_the_turn_limit(env):
    steps = play(env, "hamlet", ["I do not know.", '{"name": "lookup", "arguments": {}}', "<search> zzz </search>",
                                 "<search> Hamlet </search>"])  # fmt: skip
    assert steps[0].observation == INVALID and steps[0].info["verified"] is False
    assert "unknown tool 'lookup'" in steps[1].observation
    assert steps[2].observation == "<information>No results.</information>" and steps[2].info["verified"] is False
    assert [s.done for s in steps] == [False, False, False, True]
    assert steps[-1].info["truncated"] and steps[-1].reward == 0.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer> x </answer>")


# ---- expert and mistakes ---------------------------------------------------------------------------------------

def test_the_expert_searches_until_the_evidence_holds_the_answer_then_answers(env):
    assert isinstance(env, HasExpert) and isinstance(env, HasMistakes)
    env.reset(next(t for t in env.tasks("train") if t.id == "menzies"))
    assert env.expert_action() == "<search> boarding school Robert Menzies </search>"  # the known query first
    env.step(env.expert_action())
    assert env.expert_action() == "<answer> Marion, South Australia </answer>"  # p1 names Marion, South Australia
    assert env.step(env.expert_action()).won
    env.reset(next(t for t in env.tasks("train") if t.id == "hamlet"))  # no known queries: the question itself
    assert env.expert_action() == "<search> Who wrote the tragedy Hamlet? </search>"


def test_mistakes_are_off_topic_queries_or_wrong_answers(env):
    rng = random.Random(0)
    env.reset(next(t for t in env.tasks("train") if t.id == "menzies"))
    env.step("<search> boarding school Robert Menzies </search>")
    seen = {env.mistaken_action(rng) for _ in range(40)}
    others = {t.data["question"] for t in env.tasks("train") if t.id != "menzies"}
    assert {f"<search> {q} </search>" for q in others} <= seen
    answers = {s for s in seen if s.startswith("<answer>")}
    assert answers and all(not exact_match(s[8:-9], ["Marion, South Australia", "Marion"]) for s in answers)


def test_snapshot_and_restore_branch_an_episode(env):
    env.reset(env.tasks("train")[0])
    env.step("<search> boarding school Robert Menzies </search>")
    state = env.snapshot()
    assert env.step("<answer> Melbourne </answer>").reward == 0.0
    env.restore(state)
    assert env.step(env.expert_action()).won


# ---- files ---------------------------------------------------------------------------------------------------------

def test_question_files_in_every_answer_layout_and_parquet(files, tmp_path):
    questions, _ = files
    tasks = read_questions(questions / "train.jsonl", "train")
    assert [t.data["answers"] for t in tasks] == [["Marion, South Australia", "Marion"], ["William Shakespeare"],
                                                  ["30 August 1835"]]  # fmt: skip
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"question": q["question"], "golden_answers": [q.get("golden_answers", "x")] if isinstance(
        q.get("golden_answers"), str) else q.get("golden_answers", ["x"])} for q in QUESTIONS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dev.parquet")
    parquet = read_questions(tmp_path / "dev.parquet", "dev")
    assert [t.id for t in parquet] == ["dev-0", "dev-1", "dev-2"]
    assert parquet[0].data["answers"] == ["Marion, South Australia", "Marion"]


@pytest.mark.parametrize("row, where", [
    ({"golden_answers": ["x"]}, "question"),
    ({"question": "q?", "golden_answers": []}, "golden_answers"),
    ({"question": "q?", "ground_truth": {"target": [1]}}, "ground_truth.target"),
    ({"question": "q?"}, "no golden answers"),
    ({"question": "q?", "golden_answers": "x", "queries": "ok", "id": [1]}, "id"),
])  # fmt: skip
def test_bad_question_records_name_file_line_and_field(tmp_path, row, where):
    path = write_jsonl(tmp_path / "train.jsonl", [QUESTIONS[1], row])
    with pytest.raises(InputError, match=rf"train.jsonl:2: .*{where}"):
        read_questions(path, "train")


def test_bad_corpus_lines_and_duplicates_are_refused(tmp_path):
    with pytest.raises(InputError, match=r"c.jsonl:2: contents"):
        read_corpus(write_jsonl(tmp_path / "c.jsonl", [CORPUS[0], {"id": "x"}]))
    with pytest.raises(InputError, match=r"c.jsonl:2: id: duplicate passage id 'p1'"):
        read_corpus(write_jsonl(tmp_path / "c.jsonl", [CORPUS[0], CORPUS[0]]))
    with pytest.raises(InputError, match=r"d.jsonl:2: id: duplicate id 'hamlet'"):
        read_questions(write_jsonl(tmp_path / "d.jsonl", [QUESTIONS[1], QUESTIONS[1]]), "d")


def test_the_command_line_refuses_missing_or_bad_files_with_exit_2(files, tmp_path, capsys):
    questions, corpus = files
    out = str(tmp_path / "pool.jsonl")
    bad = write_jsonl(tmp_path / "bad.jsonl", [CORPUS[0], {"id": 3, "contents": ""}])
    cases = [
        (["--data", str(questions)], "exactly one of corpus"),
        (["--data", str(questions), "--corpus", str(tmp_path / "none.jsonl")], "none.jsonl: cannot"),
        (["--data", str(questions), "--corpus", bad], "bad.jsonl:2: contents"),
        (["--data", str(tmp_path / "nothing"), "--corpus", corpus], "no such question file"),
        (["--data", str(questions), "--corpus", corpus, "--split", "dev"], "no split 'dev'"),
    ]
    for extra, message in cases:
        code = exit_status(["collect", "--env", "search", *extra, "--policy", "expert", "--episodes", "2", "--out", out,
                     "--no-progress"])  # fmt: skip
        assert code == 2 and message in capsys.readouterr().err, extra
        assert not (tmp_path / "pool.jsonl").exists()
    assert exit_status(["collect", "--env", "household", "--short", "--corpus", corpus, "--policy", "expert",
                      "--episodes", "1", "--out", out, "--no-progress"]) == 2  # fmt: skip
    assert "only for --env search" in capsys.readouterr().err


def test_collect_and_rebuild_from_the_recorded_description(files, tmp_path):
    questions, corpus = files
    out = tmp_path / "pool.jsonl"
    assert main(["collect", "--env", "search", "--data", str(questions), "--corpus", corpus, "--policy", "expert",
                 "--policy", "random", "--episodes", "3", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    experts = [r for r in records if r["policy"] == "expert-eps0"]
    assert len(experts) == 3 and all(r["success"] for r in experts)
    env = SearchEnv(questions, corpus=corpus)
    assert isinstance(env, Describable)
    again = rebuild(json.loads(json.dumps(env.describe())))()
    assert again.describe() == env.describe() and [t.id for t in again.tasks("test")] == ["hamlet", "melbourne"]
    assert env_factory("search", data=str(questions), corpus=corpus, topk=1)().topk == 1
    with pytest.raises(ValueError, match="takes the options corpus"):
        env_factory("search", data=str(questions), corpus=corpus, domain="x")


# ---- retrieval over HTTP -----------------------------------------------------------------------------------------

@pytest.fixture()
def server(files):
    _, corpus = files
    index = BM25Index(read_corpus(corpus))
    httpd = make_server(index, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield index, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def post(url: str, body: bytes) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_server_speaks_search_r1s_protocol_and_the_client_reads_it(server):
    index, url = server
    status, answer = post(url, json.dumps({"queries": ["Hamlet tragedy", "Melbourne founded"], "topk": 2,
                                           "return_scores": True}).encode())  # fmt: skip
    assert status == 200 and answer["result"][0][0]["document"] == CORPUS[3] and answer["result"][0][0]["score"] > 0
    _, plain = post(url, json.dumps({"queries": ["Hamlet"]}).encode())
    assert plain["result"][0][0] == CORPUS[3]  # without return_scores: the documents themselves
    queries = ["boarding school Menzies", "Hamlet", "founded 1838", "zzz"]
    assert RetrievalClient(url).search(queries, 3) == index.search(queries, 3)
    for body, status_code in [(b"{not json", 400), (b'{"queries": "x"}', 400), (b'{"queries": ["x"], "topk": 0}', 400),
                              (json.dumps({"queries": ["x"] * 3000, "topk": 100}).encode(), 400)]:  # fmt: skip
        code, error = post(url, body)
        assert code == status_code and "error" in error


@pytest.mark.parametrize("corpus, argv, message", [
    ([{"id": "a", "contents": "the of and"}, {"id": "b", "contents": "!!!"}], [], "no passage has a word BM25 can index"),
    (CORPUS, ["--host", ""], "--host '' would listen on every interface"),
])  # fmt: skip
def test_serve_retriever_refuses_what_it_cannot_serve_before_listening(corpus, argv, message, tmp_path, capsys):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
    assert exit_status(["serve-retriever", str(tmp_path / "corpus.jsonl"), "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "serving" not in err


def test_the_server_answers_search_r1s_batch_of_2560_queries(server):
    """Search-R1's GRPO script sends every active rollout's query in one request: 2,560 of them, topk 3, with scores
    (its client then reads ``["result"]`` and would crash on an error answer)."""
    import requests

    index, url = server
    queries = [f"{word} {k}" for k in range(512) for word in ("Hamlet", "Melbourne founded", "Menzies school",
                                                                 "Marion city", "nothing")]  # fmt: skip
    # Search-R1's own client (search_r1/llm_agent/generation.py, _batch_search and _passages2string), as written
    answer = requests.post(url + "/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    assert len(answer["result"]) == 2560
    assert all(doc_item["document"]["contents"].split("\n")[0] for hits in answer["result"] for doc_item in hits)
    assert [[hit["document"]["id"] for hit in hits] for hits in answer["result"][:5]] == \
        [[p.id for p in hits] for hits in index.search(queries[:5], 3)]  # fmt: skip


# ---- the server's bounds: results per request, memory per connection ---------------------------------------------

def raw_post(address: tuple[str, int], payload: dict) -> tuple[int, dict[str, str], bytes]:
    """A ``/retrieve`` answer as sent: status, headers and the body's bytes."""
    import http.client

    connection = http.client.HTTPConnection(*address, timeout=60)
    try:
        connection.request("POST", "/retrieve", json.dumps(payload), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_request_over_the_result_limit_is_refused_and_the_server_keeps_answering(server):
    """10,000 queries × topk 26 (a 0.2 MB request) used to be answered with 187 MB; now more than ``--max-results``
    results (queries × topk) are refused with HTTP 400 naming the limit and the option, before any retrieval."""
    from deltattg.envs.search.retrieval import MAX_RESULTS

    _, url = server
    status, error = post(url, json.dumps({"queries": ["Hamlet tragedy"] * 10_000, "topk": 26}).encode())
    assert status == 400 and f"at most {MAX_RESULTS:,}" in error["error"] and "--max-results" in error["error"]
    assert 2560 * 3 <= MAX_RESULTS  # Search-R1's GRPO batch fits the default
    status, answer = post(url, json.dumps({"queries": ["Hamlet tragedy"], "topk": 2}).encode())
    assert status == 200 and answer["result"][0][0] == CORPUS[3]


def test_a_search_r1_batch_is_answered_byte_for_byte_as_before(server):
    """The answer is now encoded while it is written; its bytes and Content-Length are what ``json.dumps`` of the
    whole answer gave."""
    index, url = server
    address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
    queries = [f"{word} {k}" for k in range(512) for word in ("Hamlet", "Melbourne founded", "Menzies school",
                                                                 "Marion city", "nothing")]  # fmt: skip
    for payload in ({"queries": queries, "topk": 3, "return_scores": True}, {"queries": queries[:7]},
                    {"queries": [], "topk": 3}):  # fmt: skip
        with_scores, topk = payload.get("return_scores", False), payload.get("topk", 3)
        before = json.dumps({"result": [[{"document": p.as_json(), "score": s} if with_scores else p.as_json()
                                         for p, s in hits] for hits in index.scored(payload["queries"], topk)]})
        status, headers, body = raw_post(address, payload)
        assert status == 200 and body == before.encode() and int(headers["Content-Length"]) == len(body)


def long_passages_index(n: int = 8, words: int = 250) -> BM25Index:
    """``n`` passages of about 1.8 KB, every one matching the query word ``alpha``."""
    from deltattg.envs.search.data import Passage

    return BM25Index([Passage(f"p{k}", f"Passage {k}\n" + " ".join(["alpha", *(f"w{k}x{j}" for j in range(words))]))
                      for k in range(n)])  # fmt: skip


BIG_REQUEST = {"queries": [f"alpha {k}" for k in range(2000)], "topk": 8, "return_scores": True}  # 16,000 results


def slow_reader(address: tuple[str, int], payload: dict) -> tuple[socket.socket, int]:
    """A client that sends ``payload``, reads the answer's headers and then stops reading; its socket and the answer's
    Content-Length."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(address)
    body = json.dumps(payload).encode()
    client.sendall(b"POST /retrieve HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    received = b""
    while b"\r\n\r\n" not in received:
        received += client.recv(1)
    headers = received.decode().lower().split("\r\n")
    assert headers[0].startswith("http/1.0 200"), headers[0]
    return client, int(next(h for h in headers if h.startswith("content-length:")).split(":")[1])


def test_slow_readers_hold_little_memory_while_their_answers_are_written():
    """Three clients that read an answer's headers and then stop reading used to hold the whole encoded answer each
    until the connection timeout (three 10,000-query requests: 1.3 GB for 30 s); the answer is now encoded as it is
    written, so a connection holds its passages' references and one block of text."""
    import tracemalloc

    httpd = make_server(long_passages_index(), "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    address = httpd.server_address[:2]
    readers = []
    try:
        assert raw_post(address, {"queries": ["alpha"]})[0] == 200  # warm
        tracemalloc.start()
        baseline = tracemalloc.get_traced_memory()[0]
        readers = [slow_reader(address, BIG_REQUEST) for _ in range(3)]
        held = tracemalloc.get_traced_memory()[0] - baseline
        answer_bytes = readers[0][1]
        assert answer_bytes > 25_000_000
        assert held < answer_bytes / 2, f"three slow readers hold {held:,} bytes (an answer: {answer_bytes:,})"
    finally:
        tracemalloc.stop()
        for client, _ in readers:
            client.close()
        try:
            assert raw_post(address, {"queries": ["alpha"]})[0] == 200
        finally:
            httpd.shutdown()
            httpd.server_close()


def test_a_reader_that_stops_reading_is_dropped(monkeypatch, capsys):
    """With the only handler slot held by a client that does not read its (large) answer, the next request is
    answered once that client is dropped: every block of an answer is written within the connection timeout."""
    from deltattg.envs.search import retrieval

    monkeypatch.setattr(retrieval, "CONNECTION_TIMEOUT_S", 1.0)
    httpd = make_server(long_passages_index(), "127.0.0.1", 0, max_handlers=1)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    address = httpd.server_address[:2]
    try:
        client, length = slow_reader(address, BIG_REQUEST)
        assert raw_post(address, {"queries": ["alpha"]})[0] == 200
        received = 0
        try:
            while chunk := client.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        client.close()
        assert received < length  # cut off
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "Traceback" not in capsys.readouterr().err


def test_serve_retriever_takes_its_result_limit_from_the_command_line(files):
    """``deltattg serve-retriever --max-results N`` as a process: N results per request are answered, more refused."""
    import subprocess
    import sys

    _, corpus = files
    process = subprocess.Popen([sys.executable, "-m", "deltattg", "serve-retriever", corpus, "--port", "0",
                                "--max-results", "6"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = process.stderr.readline()
        assert line.startswith("serving 4 passages"), line
        address = ("127.0.0.1", int(line.split("http://127.0.0.1:")[1].split("/")[0]))
        assert raw_post(address, {"queries": ["Hamlet", "Melbourne", "Marion"], "topk": 2})[0] == 200
        status, _, body = raw_post(address, {"queries": ["Hamlet", "Melbourne", "Marion"], "topk": 3})
        assert status == 400 and "at most 6 per request" in json.loads(body)["error"]
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stderr.close()


def test_the_client_keeps_topk_and_names_passages_without_ids(files):
    """A server that sends more documents than asked, without ids (Search-R1's BM25 path): the client keeps the first
    ``topk`` and gives each passage an id of its contents, so two passages never share one; titles keep their
    quotes, as Search-R1 shows them."""
    from deltattg.envs.search.retrieval import content_id, passages_of

    documents = [{"contents": c["contents"]} for c in CORPUS]
    body = json.dumps({"result": [[{"document": d, "score": 1.0} for d in documents]]}).encode()
    (hits,) = passages_of(body, 1, topk=2)
    assert [p.contents for p in hits] == [c["contents"] for c in CORPUS[:2]]
    assert hits[0].id == content_id(CORPUS[0]["contents"]) != hits[1].id and hits[0].id.startswith("sha256:")
    assert hits[0].title == '"Westminster School, Adelaide"'


def test_a_stalled_client_is_dropped_and_a_disconnect_is_quiet(files, monkeypatch, capsys):
    """A client that sends half a request and stops is dropped after the connection timeout (it holds no thread for
    good); one that disconnects before its answer prints no traceback; the server keeps answering."""
    from deltattg.envs.search import retrieval

    monkeypatch.setattr(retrieval, "CONNECTION_TIMEOUT_S", 0.5)
    _, corpus = files
    httpd = make_server(BM25Index(read_corpus(corpus)), "127.0.0.1", 0, max_handlers=2)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        stalled = []
        for _ in range(2):  # both handler slots taken by half-sent requests
            client = socket.create_connection(httpd.server_address[:2])
            client.sendall(b"POST /retrieve HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            stalled.append(client)
        status, _ = post(url, json.dumps({"queries": ["Hamlet"]}).encode())  # answered once a stalled one is dropped
        assert status == 200
        for client in stalled:
            assert client.recv(1024) == b""  # the server closed it
            client.close()
        quitter = socket.create_connection(httpd.server_address[:2])
        quitter.sendall(b"POST /retrieve HTTP/1.1\r\nContent-Length: 20\r\n\r\n")
        quitter.close()
        time.sleep(0.8)
        assert post(url, json.dumps({"queries": ["Hamlet"]}).encode())[0] == 200
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "Traceback" not in capsys.readouterr().err


def test_verls_search_r1_parquet_is_read(tmp_path):
    """The rows verl's ``examples/data_preprocess/preprocess_search_r1_dataset.py`` writes: the question only under
    ``extra_info.question``, the answers under ``reward_model.ground_truth.target``."""
    import pandas as pd

    rows = [{"data_source": "searchR1_nq", "prompt": [{"role": "system", "content": "You are a helpful assistant."},
                                                       {"role": "user", "content": "Answer... Question: " + q["question"]}],
             "ability": "fact-reasoning",
             "reward_model": {"ground_truth": {"target": ["Marion"]}, "style": "rule"},
             "extra_info": {"index": k, "need_tools_kwargs": True, "question": q["question"], "split": "train",
                            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": ["Marion"]},
                                                                           "question": q["question"],
                                                                           "data_source": "searchR1_nq"}}}},
             "metadata": None} for k, q in enumerate(QUESTIONS)]  # fmt: skip
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    tasks = read_questions(path, "train")
    assert [t.data["question"] for t in tasks] == [q["question"] for q in QUESTIONS]
    assert all(t.data["answers"] == ["Marion"] and t.data["source"] == "searchR1_nq" for t in tasks)


def test_a_dead_server_is_a_failed_step_not_an_exception(files):
    questions, _ = files
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = SearchEnv(questions, retriever=f"http://127.0.0.1:{port}", retriever_timeout=2)
    env.reset(env.tasks("train")[0])
    result = env.step("<search> anything </search>")
    assert not result.done and result.info["verified"] is False
    assert result.observation.startswith("Search failed: no answer from") and "refused" in result.observation


def test_a_hanging_or_misbehaving_server_costs_one_deadline(files):
    questions, _ = files
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        env = SearchEnv(questions, retriever=url, retriever_timeout=1.5)
        env.reset(env.tasks("train")[0])
        started = time.monotonic()
        result = env.step("<search> anything </search>")
        assert time.monotonic() - started < 5
        assert "within the 1.5 s deadline" in result.observation and not result.done
    finally:
        listener.close()


def test_evaluate_stops_when_the_retrieval_server_keeps_failing(files, tmp_path, capsys):
    """A dead server used to give exit 0 and 100 % expert success; now the run stops after MAX_FAILURES_IN_A_ROW
    failed requests in a row (exit 69), keeping no half-played episode."""
    from deltattg.command import EXIT_SERVICE_DOWN
    from deltattg.envs.search.retrieval import MAX_FAILURES_IN_A_ROW

    questions = tmp_path / "many"  # 2 × 4 searches by the expert: more than MAX_FAILURES_IN_A_ROW
    questions.mkdir()
    write_jsonl(questions / "train.jsonl", [dict(q, id=f"{q['id']}{k}") for k in range(2) for q in QUESTIONS])
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = exit_status(["evaluate", "--env", "search", "--data", str(questions), "--retriever",
                        f"http://127.0.0.1:{port}", "--actor", "expert", "--out", str(tmp_path / "eval"),
                        "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_SERVICE_DOWN and "Traceback" not in err
    assert f"failed {MAX_FAILURES_IN_A_ROW} requests in a row" in err and f"127.0.0.1:{port}" in err
    assert not (tmp_path / "eval" / "results.json").exists()


class _FlakyHandler(BaseHTTPRequestHandler):
    """A retrieval server that fails three requests with HTTP 500 (a client's first try and both retries), then
    answers one, and so on: every other search fails, never five in a row."""

    index: BM25Index
    requests = 0

    def do_POST(self):
        type(self).requests += 1
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status, text = (500, json.dumps({"error": "flaky"})) if self.requests % 4 else \
            (200, "".join(retrieve_answer(self.index, json.loads(body), 3).pieces()))  # fmt: skip
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_failed_retrievals_are_kept_in_the_records_counted_and_warned_about(files, tmp_path, capsys):
    questions, corpus = files
    handler = type("Flaky", (_FlakyHandler,), {"index": BM25Index(read_corpus(corpus)), "requests": 0})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        code = exit_status(["evaluate", "--env", "search", "--data", str(questions), "--retriever",
                            f"http://127.0.0.1:{httpd.server_address[1]}", "--actor", "expert", "--out",
                            str(tmp_path / "eval"), "--no-progress"])  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()
    err = capsys.readouterr().err
    assert code == 0 and "warning: the environment could not carry out" in err
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").read_text().splitlines()]
    errors = [step["error"] for r in records for step in r["steps"] if "error" in step]
    assert results["failed_steps"] == len(errors) > 0 and all("500" in e for e in errors)
    assert results["episodes_with_failed_steps"] == sum(any("error" in s for s in r["steps"]) for r in records)
    assert "could not carry out" in (tmp_path / "eval" / "results.md").read_text()


def test_a_wrong_answer_shape_is_a_failed_search(files):
    questions, _ = files

    class Wrong(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"result": [[{"document": {"id": 1}}]]}).encode()  # no contents
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Wrong)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = SearchEnv(questions, retriever=f"http://127.0.0.1:{httpd.server_address[1]}/retrieve")
        env.reset(env.tasks("train")[0])
        result = env.step("<search> anything </search>")
        assert result.observation.startswith("Search failed: not a /retrieve answer")
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- the closed set from AgentProcessBench ------------------------------------------------------------------------

def test_the_closed_set_from_recorded_trajectories_keeps_only_answerable_questions(hotpotqa_path, tmp_path):
    assert main(["search-data", str(hotpotqa_path), "--out", str(tmp_path / "sq")]) == 0
    env = SearchEnv(tmp_path / "sq" / "questions", corpus=tmp_path / "sq" / "corpus.jsonl")
    tasks = [*env.tasks("train"), *env.tasks("test")]
    assert len(tasks) >= 30 and len(env.tasks("test")) >= 5
    passages = {p.id: p for p in read_corpus(tmp_path / "sq" / "corpus.jsonl")}
    assert len(passages) > 1000
    evidence = 0
    for task in tasks:  # every kept answer is in the corpus; the expert wins every task, mostly from evidence
        assert any(mentions(p.contents, task.data["answers"]) for p in passages.values())
        env.reset(task)
        while not (result := env.step(env.expert_action())).done:
            pass
        assert result.won
        evidence += any(mentions(p.contents, task.data["answers"]) for p in env.snapshot().seen)
    assert evidence / len(tasks) >= 0.8


def recorded(ground_truth=None, messages=None) -> dict:
    """A Search-R1 trajectory as AgentProcessBench records it: one search returning one passage, then the answer."""
    call = {"function": {"name": "search", "arguments": json.dumps({"query_list": ["Hamlet author"]})}}
    hits = {"result": [[{"document": {"id": "d1", "contents": '"Hamlet"\nHamlet is a tragedy by Shakespeare.'}}]]}
    return {"question": "Who wrote Hamlet?", "ground_truth": ground_truth or {"target": ["Shakespeare"]},
            "answer_text": "Shakespeare",
            "messages": messages or [{"role": "user", "content": "Who wrote Hamlet?"},
                                     {"role": "assistant", "content": "", "tool_calls": [call]},
                                     {"role": "tool", "content": json.dumps(hits)}]}  # fmt: skip


@pytest.mark.parametrize("shape, change", [
    ("ground_truth a string", lambda r: dict(r, ground_truth="Shakespeare")),
    ("ground_truth a list", lambda r: dict(r, ground_truth=["Shakespeare"])),
    ("arguments an object", lambda r: r["messages"][1]["tool_calls"][0]["function"].update(
        arguments={"query_list": ["Hamlet author"]}) or r),
    ("tool content in parts", lambda r: r["messages"][2].update(
        content=[{"type": "text", "text": r["messages"][2]["content"]}]) or r),
])  # fmt: skip
def test_search_data_reads_the_shapes_recorders_write(shape, change, tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps(change(recorded())) + "\n")
    assert main(["search-data", str(tmp_path / "in.jsonl"), "--test-share", "0", "--out", str(tmp_path / "sq")]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "sq" / "questions" / "train.jsonl").read_text().splitlines()]
    assert row["golden_answers"] == ["Shakespeare"] and row["queries"] == ["Hamlet author"]
    assert [json.loads(line)["id"] for line in (tmp_path / "sq" / "corpus.jsonl").read_text().splitlines()] == ["d1"]


@pytest.mark.parametrize("change, field", [
    (lambda r: dict(r, ground_truth={"target": 3}), "ground_truth"),
    (lambda r: dict(r, messages=["Who wrote Hamlet?"]), "messages[0]"),
    (lambda r: r["messages"][1].update(tool_calls="search") or r, "messages[1].tool_calls"),
    (lambda r: r["messages"][1].update(tool_calls=[{"function": "search"}]) or r, "messages[1].tool_calls[0].function"),
])  # fmt: skip
def test_search_data_names_the_line_and_field_of_a_shape_it_cannot_read(change, field, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text(json.dumps(recorded()) + "\n" + json.dumps(change(recorded())) + "\n")
    assert main(["search-data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "sq")]) == 2
    err = capsys.readouterr().err
    assert f"in.jsonl:2: {field}: " in err and "Traceback" not in err and not (tmp_path / "sq").exists()


def test_evaluate_does_not_resume_a_run_of_another_retrieval_setting(files, tmp_path, capsys):
    """A rerun with ``--topk 5`` into a ``--topk 1`` folder (or another corpus) used to write no episode and report
    the old run's figures: the environment's whole description is part of the run's settings."""
    questions, corpus = files
    out = tmp_path / "eval"
    argv = ["evaluate", "--env", "search", "--data", str(questions), "--corpus", corpus, "--actor", "expert",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main([*argv, "--topk", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--topk", "5"]) == 2
    assert "environment.options.topk 1 (now 5)" in capsys.readouterr().err
    assert main([*argv, "--topk", "1"]) == 0  # the same settings resume (nothing left to play)
