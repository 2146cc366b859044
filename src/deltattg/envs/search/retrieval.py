"""Retrieval for the search environment, both sides of Search-R1's protocol.

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->              {"result": [[{"document": {"id": "...", "contents": "Title\\ntext"}, "score": 0.85}, ...], ...]}

(without ``return_scores``, each query's list holds the documents themselves). This is what Search-R1's
``retrieval_server.py`` serves and what the AgentProcessBench trajectories record.

* :class:`BM25Index` — a local retriever over a corpus JSONL (``bm25s``, Lucene's BM25, English stop words), built in
  memory once per corpus file and process; passages no query term matches are not returned.
* :class:`RetrievalClient` — a client of any server speaking the protocol, each request a
  :class:`~deltattg.deadline_post.DeadlinePost` (one deadline, bounded retries, redirects not followed).
* :func:`make_server` — ``deltattg serve-retriever CORPUS --port P``: the protocol over a :class:`BM25Index`
  (standard library HTTP server). It serves what Search-R1 sends — every active rollout's query in one request
  (2,560 × topk 3 in its GRPO script) — and bounds the work and the memory of each request: a body over 16 MiB,
  ``topk`` over 100 or queries × ``topk`` over ``max_results`` (``--max-results``, default 32,768) results are
  refused with HTTP 400/413 and a JSON ``{"error": ...}`` naming the limit; an answer is held as references to its
  passages and encoded one query at a time as it is written (a 64 KiB block per write), so a slow reader holds no
  copy of its answer's text; at most 32 requests are answered at once (the rest wait in a listen backlog of 512),
  and a client that sends nothing for 30 s, or takes less than a block of its answer in 30 s, is dropped. A client
  that disconnects early is no error.

A failed retrieval is a :class:`RetrievalError` with a one-line reason; the environment turns it into a failed step
(its ``error`` kept in the record, counted and warned about by ``collect`` and ``evaluate``). A client whose server
fails ``MAX_FAILURES_IN_A_ROW`` requests in a row raises ``ServiceDown``: the run stops, keeping what it finished.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from deltattg.deadline_post import DeadlinePost, http_url_parts, snippet
from deltattg.envs.search.data import Passage, read_corpus
from deltattg.errors import InputError, ServiceDown

MAX_TOPK = 100
MAX_RESULTS = 1 << 15  # queries × topk of one request (--max-results): Search-R1's GRPO batch is 2,560 queries × 3
MAX_REQUEST_BYTES = 16 << 20
CONNECTION_TIMEOUT_S = 30.0  # a client that sends or takes nothing for this long is dropped (stalled, or not reading)
WRITE_BLOCK_BYTES = 1 << 16  # an answer is written in blocks of this size, each within CONNECTION_TIMEOUT_S
MAX_HANDLERS = 32  # requests answered at once; more wait in the listen backlog
MAX_FAILURES_IN_A_ROW = 5  # failed requests in a row after which a client stops the run (ServiceDown)
SLOT_WAIT_TIMEOUTS = 4  # how many connection timeouts a new connection waits for a free handler slot
LISTEN_BACKLOG = 512  # Search-R1 trains with hundreds of concurrent rollouts
RETRIEVE_PATH = "/retrieve"


class RetrievalError(RuntimeError):
    """A retrieval that gave no passages: the server did not answer, or answered something else."""


class Retriever(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The top ``topk`` passages of each query, best first."""
        ...


class BM25Index:
    """BM25 over a list of passages (see the module doc)."""

    def __init__(self, passages: Sequence[Passage]):
        import bm25s

        self.passages = list(passages)
        self._bm25 = bm25s.BM25()
        tokens = self._tokenize([p.contents for p in self.passages])
        if not tokens.vocab:
            raise ValueError("no passage has a word BM25 can index (every word is an English stop word or "
                             "punctuation, or the corpus is empty)")  # fmt: skip
        self._bm25.index(tokens, show_progress=False)
        self._lock = threading.Lock()  # bm25s keeps per-call state: one search at a time

    @staticmethod
    def _tokenize(texts: list[str]) -> Any:
        import bm25s

        return bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def scored(self, queries: Sequence[str], topk: int) -> list[list[tuple[Passage, float]]]:
        """The top ``topk`` ``(passage, score)`` of each query with a positive score, best first."""
        if not queries:
            return []
        k = max(1, min(topk, len(self.passages)))
        with self._lock:
            ids, scores = self._bm25.retrieve(self._tokenize(list(queries)), k=k, show_progress=False, n_threads=1)
        return [[(self.passages[int(i)], float(s)) for i, s in zip(row, row_scores) if s > 0]
                for row, row_scores in zip(ids.tolist(), scores.tolist())]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[p for p, _ in hits] for hits in self.scored(queries, topk)]


@functools.lru_cache(maxsize=4)
def _index(path: str, mtime_ns: int, size: int) -> BM25Index:
    try:
        return BM25Index(read_corpus(path))
    except ValueError as error:
        raise error if isinstance(error, InputError) else InputError(str(error), path=path) from None


def bm25_index(corpus: str | os.PathLike) -> BM25Index:
    """The :class:`BM25Index` of a corpus file, built once per process (until the file changes)."""
    path = Path(corpus).expanduser()
    try:
        stat = path.stat()
    except OSError as exc:
        raise InputError(f"cannot read the corpus: {exc.strerror}", path=str(corpus)) from None
    return _index(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def retrieval_url(url: str) -> str:
    """``http://host:port`` gets Search-R1's ``/retrieve`` path; a URL with a path is used as is."""
    parts = http_url_parts(url, "the retriever URL")
    return urllib.parse.urlunsplit(parts._replace(path=parts.path if parts.path.strip("/") else RETRIEVE_PATH))


def passages_of(body: bytes, n_queries: int, topk: int | None = None) -> list[list[Passage]]:
    """The passages of a ``/retrieve`` answer for ``n_queries`` queries (with or without scores), the first ``topk``
    of each where given (a server may send more than asked); :class:`RetrievalError` for anything else."""
    try:
        result = json.loads(body)["result"]
        if not isinstance(result, list) or len(result) != n_queries:
            raise ValueError(f"'result' must hold one list per query ({n_queries})")
        if not all(isinstance(hits, list) for hits in result):
            raise ValueError("each query's result must be a list")
        return [[_passage(item.get("document", item)) for item in hits[:topk]] for hits in result]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise RetrievalError(f"not a /retrieve answer ({exc}): {snippet(body)}") from None


def _passage(document: Any) -> Passage:
    """A returned document as a :class:`Passage`; one without an ``id`` (Search-R1's BM25 server sends none) is named
    by its contents (:func:`content_id`), so two different passages never share an id."""
    if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
        raise ValueError("a document is an object with a string 'contents'")
    pid = document.get("id")
    return Passage(content_id(document["contents"]) if pid is None or pid == "" else str(pid), document["contents"])


def content_id(contents: str) -> str:
    """A passage's id from its contents: ``sha256:`` and the first 16 hex digits of their SHA-256."""
    import hashlib

    return "sha256:" + hashlib.sha256(contents.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class FailureCounts:
    """Failed requests in a row per server URL, over every client of this process (an evaluation makes one
    environment, and client, per episode)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, url: str, *, failed: bool) -> int:
        """Count one request to ``url``; the failures in a row since its last success."""
        with self._lock:
            self._counts[url] = self._counts.get(url, 0) + 1 if failed else 0
            return self._counts[url]


_FAILURES_IN_A_ROW = FailureCounts()


class RetrievalClient:
    """Search through a Search-R1-compatible server at ``url`` (``http://host:port`` or the full ``/retrieve`` URL)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, max_retries: int = 2, backoff_s: float = 0.5,
                 max_failures_in_a_row: int = MAX_FAILURES_IN_A_ROW):  # fmt: skip
        self.url = retrieval_url(url)
        self._post = DeadlinePost(self.url, timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                  max_body_bytes=16 << 20, timeout_name="retriever timeout")
        self.max_failures_in_a_row = max_failures_in_a_row

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The passages (see :class:`Retriever`); a failed request raises ``RetrievalError`` (the agent sees
        "Search failed"), the ``max_failures_in_a_row``-th failed request in a row to this server in this process
        ``ServiceDown`` (the run stops)."""
        payload = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        try:
            answer = self._post.send(payload)
            if answer.body is None:
                raise RetrievalError(answer.error or f"no answer from {self.url}")
            passages = passages_of(answer.body, len(queries), topk)
        except RetrievalError as error:
            failed = _FAILURES_IN_A_ROW.record(self.url, failed=True)
            if failed >= self.max_failures_in_a_row:
                raise ServiceDown(f"the retrieval server at {self.url} failed {failed} requests in a row (the last: "
                                  f"{error}): is it running and serving /retrieve?") from None
            raise
        _FAILURES_IN_A_ROW.record(self.url, failed=False)
        return passages


# ---- the server --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RetrieveAnswer:
    """A ``/retrieve`` answer held as its passages (references into the index), not as text: its JSON is encoded one
    query's hits at a time as it is written, so a connection holds a block of text however large its answer."""

    hits: list[list[tuple[Passage, float]]]
    with_scores: bool

    def pieces(self) -> Iterator[str]:
        """The answer's JSON text in pieces, one query's hits each: joined, exactly ``json.dumps`` of the whole
        answer (ASCII: a piece's length in characters is its length in bytes)."""
        yield '{"result": ['
        for k, hits in enumerate(self.hits):
            items = [{"document": p.as_json(), "score": s} if self.with_scores else p.as_json() for p, s in hits]
            yield (", " if k else "") + json.dumps(items)
        yield "]}"

    def byte_length(self) -> int:
        """The bytes of the encoded answer (its Content-Length), counted by encoding it once without keeping it."""
        return sum(map(len, self.pieces()))


def retrieve_answer(index: BM25Index, request: Any, default_topk: int,
                    max_results: int = MAX_RESULTS) -> RetrieveAnswer:  # fmt: skip
    """The ``/retrieve`` answer to a decoded request body; ``ValueError`` naming the field for a bad request, and for
    one asking for more than ``max_results`` results (queries × topk) before any retrieval."""
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object with 'queries'")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("'queries' must be a list of strings")
    topk = request.get("topk")
    topk = default_topk if topk is None else topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"'topk' must be an integer from 1 to {MAX_TOPK}")
    if len(queries) * topk > max_results:
        raise ValueError(f"'queries' × 'topk' asks for {len(queries) * topk:,} results, at most {max_results:,} per "
                         "request: split the queries over several requests, or start serve-retriever with a larger "
                         "--max-results")  # fmt: skip
    with_scores = request.get("return_scores", False)
    if not isinstance(with_scores, bool):
        raise ValueError("'return_scores' must be true or false")
    return RetrieveAnswer(index.scored(queries, topk), with_scores)


def blocks(pieces: Iterable[str], size: int) -> Iterator[bytes]:
    """ASCII ``pieces`` joined into blocks of at least ``size`` bytes (the last may be shorter): few socket writes,
    each of a bounded block."""
    held: list[str] = []
    held_bytes = 0
    for piece in pieces:
        held.append(piece)
        held_bytes += len(piece)
        if held_bytes >= size:
            yield "".join(held).encode("ascii")
            held, held_bytes = [], 0
    if held:
        yield "".join(held).encode("ascii")


class RetrievalServer(ThreadingHTTPServer):
    """A thread per request, at most ``max_handlers`` at once (the accept loop waits for a free slot; connections
    queue in the listen backlog meanwhile); a client's disconnect or silence ends its connection quietly."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type, max_handlers: int = MAX_HANDLERS):
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_handlers)

    def process_request(self, request: Any, client_address: Any) -> None:
        # a held slot frees within one connection timeout of its client's last byte; every slot held for several
        # timeouts (clients trickling bytes) drops the waiting connection rather than queueing it for good
        if not self._slots.acquire(timeout=SLOT_WAIT_TIMEOUTS * CONNECTION_TIMEOUT_S):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # the client went away or went quiet
            return
        super().handle_error(request, client_address)


def make_server(index: BM25Index, host: str = "127.0.0.1", port: int = 8000, *, topk: int = 3,
                max_results: int = MAX_RESULTS, max_handlers: int = MAX_HANDLERS) -> RetrievalServer:
    """An HTTP server answering ``POST /retrieve`` over ``index`` (``port`` 0: any free port), at most
    ``max_results`` results (queries × topk) per request and ``max_handlers`` requests at once; call
    ``serve_forever()`` on it."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "deltattg-retriever"
        timeout = CONNECTION_TIMEOUT_S  # the socket's: a stalled or half-sent request ends the connection

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise here
            pass

        def _answer(self, status: int, value: Any) -> None:
            text = json.dumps(value)
            self._send(status, len(text), [text])

        def _send(self, status: int, length: int, pieces: Iterable[str]) -> None:
            # each block is one write under the socket's timeout: a client that stops reading is dropped
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            for block in blocks(pieces, WRITE_BLOCK_BYTES):
                self.wfile.write(block)

        def do_GET(self) -> None:
            self._answer(404 if self.path != RETRIEVE_PATH else 405, {"error": f"use POST {RETRIEVE_PATH}"})

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != RETRIEVE_PATH:
                self._answer(404, {"error": f"use POST {RETRIEVE_PATH}"})
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._answer(411, {"error": "a Content-Length is required"})
                return
            if length > MAX_REQUEST_BYTES or length < 0:
                self._answer(413, {"error": f"a request body is at most {MAX_REQUEST_BYTES} bytes"})
                return
            try:
                answer = retrieve_answer(index, json.loads(self.rfile.read(length)), topk, max_results)
            except (ValueError, RecursionError) as exc:
                self._answer(400, {"error": str(exc)})
                return
            self._send(200, answer.byte_length(), answer.pieces())

    return RetrievalServer((host, port), Handler, max_handlers)
