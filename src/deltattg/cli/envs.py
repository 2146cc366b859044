"""The environments' own data and servers: ``search-data`` (a closed question set and corpus from recorded Search-R1
trajectories), ``serve-retriever`` (Search-R1's ``/retrieve`` over a corpus, for ``--retriever`` and verl) and
``awm-examples`` (our small AWM scenarios as a release folder)."""

from __future__ import annotations

import argparse
import sys

from deltattg.cli.common import check_out
from deltattg.command import UsageError, number
from deltattg.envs.search.retrieval import MAX_RESULTS


def cmd_search_data(args: argparse.Namespace) -> int:
    """Write a closed search-QA set (corpus.jsonl, questions/train.jsonl, questions/test.jsonl) built from recorded
    trajectories."""
    from pathlib import Path

    from deltattg.envs.search.closed_corpus import closed_set, write_closed_set

    check_out(args.out, folder=True)
    for name in ("corpus.jsonl", "questions/train.jsonl", "questions/test.jsonl"):
        check_out(str(Path(args.out) / name), args.trajectories)
    closed = closed_set(args.trajectories, test_share=args.test_share)
    if not any(closed.splits.values()):
        raise UsageError(f"{args.trajectories}: no question has its golden answer in a recorded passage")
    counts = write_closed_set(closed, args.out)
    print(f"wrote {counts['corpus']} passages, {counts['train']} train and {counts['test']} test questions to "
          f"{args.out} ({closed.dropped} questions dropped: no recorded passage holds their answer)", file=sys.stderr)
    return 0


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    """Serve Search-R1's POST /retrieve over a corpus with BM25 until interrupted."""
    from deltattg.envs.search.retrieval import RETRIEVE_PATH, bm25_index, make_server

    if not args.host.strip():
        raise UsageError("--host '' would listen on every interface: name the address (127.0.0.1, the default; "
                         "0.0.0.0 for every interface)")
    try:
        index = bm25_index(args.corpus)
        server = make_server(index, args.host, args.port, topk=args.topk, max_results=args.max_results)
    except ImportError as exc:
        raise UsageError(f"{exc} (pip install 'deltattg[search]')") from None
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    host, port = server.server_address[:2]
    if host in ("0.0.0.0", "::"):
        print("deltattg: listening on every interface: anyone who can reach this machine can query the corpus",
              file=sys.stderr)
    print(f"serving {len(index.passages)} passages of {args.corpus} at http://{host}:{port}{RETRIEVE_PATH} "
          "(Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        return 130
    finally:
        server.server_close()
    return 0


def cmd_awm_examples(args: argparse.Namespace) -> int:
    """Write the example AWM scenarios as a release folder (AWM's gen_*.jsonl files and deltattg_gold.jsonl) into a
    new or empty folder."""
    from pathlib import Path

    from deltattg.envs.awm.examples import example_names, write_examples

    check_out(args.out, folder=True)
    if Path(args.out).expanduser().is_dir() and any(Path(args.out).expanduser().iterdir()):
        raise UsageError(f"--out {args.out} is not empty: name a new or empty folder (a release is written whole, "
                         "never mixed with other files)")
    counts = write_examples(args.out)
    print(f"wrote {len(example_names())} AWM scenarios ({counts['gen_verifier.pure_code.jsonl']} tasks) to {args.out}",
          file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser(
        "search-data",
        help="a closed search-QA set (corpus + questions) from recorded Search-R1 trajectories",
        description="Every passage the recorded searches returned becomes the corpus; every question whose golden "
        "answer one of them contains becomes a task (with a successful trajectory's queries, what the expert tries "
        "first). Input: AgentProcessBench-style JSONL (question, ground_truth.target, messages with search calls).",
    )
    data.add_argument("trajectories", help="recorded trajectories (e.g. AgentProcessBench hotpotqa.jsonl)")
    data.add_argument("--out", required=True, help="folder for corpus.jsonl and questions/{train,test}.jsonl (the "
                      "search environment's --corpus and --data)")
    data.add_argument("--test-share", type=number(float, low=0, high=1), default=0.25,
                      help="share of the questions in questions/test.jsonl (by a hash of the question), "
                      "default %(default)s")
    data.set_defaults(func=cmd_search_data)

    serve = sub.add_parser(
        "serve-retriever",
        help="serve Search-R1's POST /retrieve over a corpus JSONL with BM25",
        description="The retrieval server the search environment's --retriever (and Search-R1 / verl search tools) "
        "talk to: POST /retrieve with {queries, topk, return_scores}. A request asking for more than --max-results "
        "results (queries × topk) is refused with HTTP 400; an answer is encoded as it is written, and a client "
        "that sends nothing for 30 s, or takes less than 64 KiB of its answer in 30 s, is dropped.",
    )
    serve.add_argument("corpus", help="passage corpus JSONL, one {\"id\", \"contents\": \"Title\\ntext\"} a line")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on, default %(default)s (loopback)")
    serve.add_argument("--port", type=number(int, low=0, high=65535), default=8000,
                       help="port, default %(default)s (0: any free port)")
    serve.add_argument("--topk", type=number(int, low=1, high=100), default=3,
                       help="passages per query when a request gives no topk, default %(default)s")
    serve.add_argument("--max-results", type=number(int, low=1), default=MAX_RESULTS,
                       help="the most results (queries × topk) one request may ask for, default %(default)s: "
                       "Search-R1's batch (2,560 queries × topk 3) fits; larger requests are refused with HTTP 400")
    serve.set_defaults(func=cmd_serve_retriever)

    awm = sub.add_parser(
        "awm-examples",
        help="write our small Agent World Model scenarios as an AWM release folder (for --env awm --data)",
        description="Each scenario in AWM's released format: database schema and sample SQL, FastAPI code served as "
        "MCP, tasks and code-mode verifiers; plus deltattg_gold.jsonl, the gold tool calls the expert plays.",
    )
    awm.add_argument("--out", required=True, help="a new or empty folder to write the gen_*.jsonl files into")
    awm.set_defaults(func=cmd_awm_examples)
