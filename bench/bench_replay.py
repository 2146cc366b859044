"""How many recorded states each environment puts back exactly (issue 34's replay check), and what a replay costs.

Per environment: ``--episodes`` episodes of a noisy expert (ε = 0.3) and of the random policy, recorded as
``deltattg collect`` records them; each record is rebuilt from its own ``env`` description, reset to its task and
stepped through its actions (``rollout.replay.check_replay``), every observation compared with the recorded one.
Prints, per environment, the states replayed ÷ recorded, the causes of those that did not, and seconds per replayed
state (a fresh environment per record: ALFWorld's game load and AWM's server start are in it).

    .venv/bin/deltattg search-data ../shared/data/agentprocessbench/hotpotqa.jsonl --out runs/search-closed
    .venv/bin/python bench/bench_replay.py --episodes 20 --alfworld $ALFWORLD_DATA --search runs/search-closed
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from deltattg.envs.registry import env_factory
from deltattg.rollout.collect import collect, parse_policy
from deltattg.envs.replay import check_replay, recorded_episode


def environments(args: argparse.Namespace) -> dict:
    """name -> (make_env, split, max_turns) of every environment that can run here."""
    out = {"household": (env_factory("household", size="short"), "train", 12)}
    if args.search:
        out["search"] = (env_factory("search", data=f"{args.search}/questions", corpus=f"{args.search}/corpus.jsonl"),
                         "train", 6)  # fmt: skip
    for name, split, turns in (("bfcl", "base", 10), ("tau2", "retail", 10), ("awm", "all", 8)):
        try:
            out[name] = (env_factory(name), split, turns)
        except ImportError as exc:
            print(f"[bench] {name} skipped: {exc}", file=sys.stderr)
    if args.alfworld:
        out["alfworld"] = (env_factory("alfworld", data=args.alfworld), "valid_seen", 20)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20, help="episodes per policy and environment (default 20)")
    parser.add_argument("--envs", nargs="+", help="only these environments")
    parser.add_argument("--alfworld", help="the ALFWorld json_2.1.1 folder (ALFWorld is skipped without it)")
    parser.add_argument("--search", help="a closed search set as `deltattg search-data` writes it (questions/ and "
                        "corpus.jsonl; search is skipped without it)")
    parser.add_argument("--summary", help="also write the table as a summary (deltattg.summaries; the docs' tables)")
    args = parser.parse_args(argv)
    command = ["bench/bench_replay.py", *(sys.argv[1:] if argv is None else argv)]  # before ALFWorld rewrites argv
    specs = [parse_policy("expert:0.3"), parse_policy("random")]
    rows = []
    for name, (make_env, split, turns) in environments(args).items():
        if args.envs and name not in args.envs:
            continue
        tasks = len(make_env().tasks(split))
        group = -(-args.episodes // tasks)  # a small split's tasks played more than once each
        pool = collect(make_env, split, specs, episodes=args.episodes, group_size=group, max_turns=turns,
                       progress=False)  # fmt: skip
        started = time.perf_counter()
        checks = [check_replay(recorded_episode(t)) for t in pool]
        seconds = time.perf_counter() - started
        replayed, states = sum(c.replayed for c in checks), sum(c.states for c in checks)
        causes = Counter(c.mismatch for c in checks if not c.exact)
        print(f"{name:10s} {len(pool):4d} records  {replayed:5d} / {states:5d} states replayed "
              f"({100 * replayed / max(states, 1):.1f} %)  {1000 * seconds / max(replayed, 1):.1f} ms per state"
              + (f"  causes: {dict(causes)}" if causes else ""), flush=True)
        rows.append([name, len(pool), f"{replayed} / {states}", f"{100 * replayed / max(states, 1):.1f}",
                     f"{1000 * seconds / max(replayed, 1):.1f}", ", ".join(f"{k}: {n}" for k, n in causes.items()) or "–"])
    if args.summary:
        from deltattg.summaries import write_summary

        header = ("environment", "records", "states replayed", "replayed %", "ms per state", "mismatches")
        write_summary(args.summary, "bench_replay", command, {"replay": (header, rows)})


if __name__ == "__main__":
    main()
