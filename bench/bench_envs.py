"""Environment steps per second: one function per environment; ``main`` runs those whose extras are installed.

    .venv/bin/python bench/bench_envs.py [--episodes N] [--only household|search|alfworld|bfcl|tau2|awm] [--summary FILE]

ALFWorld reads its game files from ``$ALFWORLD_DATA`` (the ``json_2.1.1`` layout) and is skipped without them; search
reads ``$SEARCH_DATA``, a folder ``deltattg search-data`` wrote (``corpus.jsonl``, ``questions/``).

Each function plays episodes with simple policies and returns one ``Row`` per policy. Step times cover ``step`` calls
and the policy's own choice (the planner's, for the expert); resets are timed apart. Wall-clock and CPU time are both
reported: on a shared machine the CPU time is the steadier of the two.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    env: str
    policy: str
    episodes: int
    steps: int
    seconds: float  # wall-clock, in steps and the policy's choices
    cpu_seconds: float  # the same, in CPU time of this process
    reset_seconds: float  # wall-clock

    def cells(self) -> list[str]:
        return [
            self.env,
            self.policy,
            str(self.episodes),
            str(self.steps),
            f"{self.steps / self.seconds:,.0f}",
            f"{1e6 * self.seconds / self.steps:.1f}",
            f"{1e6 * self.cpu_seconds / self.steps:.1f}",
            f"{1e6 * self.reset_seconds / self.episodes:.1f}",
        ]


HEADER = ["env", "policy", "episodes", "steps", "steps/s", "µs/step", "cpu µs/step", "µs/reset"]


def _play(env, tasks: Sequence, choose: Callable[[], str], name: str, policy: str) -> Row:
    """Play one episode per task with ``choose`` picking each action."""
    steps, seconds, cpu_seconds, reset_seconds = 0, 0.0, 0.0, 0.0
    for task in tasks:
        start = time.perf_counter()
        env.reset(task)
        reset_seconds += time.perf_counter() - start
        done = False
        start, cpu_start = time.perf_counter(), time.process_time()
        while not done:
            done = env.step(choose()).done
            steps += 1
        seconds += time.perf_counter() - start
        cpu_seconds += time.process_time() - cpu_start
    return Row(name, policy, len(tasks), steps, seconds, cpu_seconds, reset_seconds)


def bench_household(episodes: int = 300, seed: int = 0) -> list[Row]:
    """The built-in household environment (default config, train split): a random admissible policy, and the
    optimal planner re-planning at every step (the expert the noisy policies build on)."""
    from deltattg.envs.household import HouseholdConfig, HouseholdEnv

    env = HouseholdEnv(HouseholdConfig(n_train=episodes))
    tasks = env.tasks("train")
    rng = random.Random(seed)
    return [
        _play(env, tasks, lambda: rng.choice(env.admissible_actions()), "household", "random admissible"),
        _play(env, tasks, env.expert_action, "household", "planner"),
    ]


def bench_search(episodes: int = 200) -> list[Row]:
    """The search environment on ``$SEARCH_DATA`` (every question of every split, repeated up to ``episodes``): the
    expert with the local BM25 index, then the same through ``deltattg serve-retriever``'s server on loopback (HTTP,
    JSON, one connection per search); a step is mostly one retrieval of top-3 passages."""
    import itertools
    import os
    import threading

    from deltattg.envs.search import SearchEnv
    from deltattg.envs.search.retrieval import bm25_index, make_server

    folder = os.environ.get("SEARCH_DATA")
    if not folder:
        raise FileNotFoundError("set $SEARCH_DATA to a folder `deltattg search-data` wrote")
    corpus, questions = os.path.join(folder, "corpus.jsonl"), os.path.join(folder, "questions")
    local = SearchEnv(questions, corpus=corpus)
    tasks = [t for split in ("train", "test") for t in local.tasks(split)]
    tasks = list(itertools.islice(itertools.cycle(tasks), episodes))
    server = make_server(bm25_index(corpus), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = SearchEnv(questions, retriever=f"http://127.0.0.1:{server.server_address[1]}")
        rows = [_play(local, tasks, local.expert_action, "search", "expert, local BM25"),
                _play(remote, tasks, remote.expert_action, "search", "expert, retrieval server")]
    finally:
        server.shutdown()
        server.server_close()
    local, served = (row.seconds / row.steps for row in rows)
    print(f"search: a step through the server takes {served / local:.2f}x the local index's time")
    return rows


def bench_alfworld(episodes: int = 4, seed: int = 0) -> list[Row]:
    """Real ALFWorld text games (``$ALFWORLD_DATA``, valid_seen; ``episodes`` games drawn with ``seed``): a random
    admissible policy (up to 50 steps) and the expert, which follows the walkthrough from the start (no planning).
    Resets include loading each game file (every episode is a new game)."""
    from deltattg.envs.alfworld import ALFWorldEnv

    rng = random.Random(seed)
    env = ALFWorldEnv()
    tasks = rng.sample(list(env.tasks("valid_seen")), episodes)
    return [
        _play(env, tasks, lambda: rng.choice(env.admissible_actions()), "alfworld", "random admissible"),
        _play(env, tasks, env.expert_action, "alfworld", "expert (walkthrough)"),
    ]


def bench_bfcl(episodes: int = 200) -> list[Row]:
    """BFCL v3 multi_turn_base (the first ``episodes`` entries): ground-truth replay, one call per step; each
    episode's last step includes BFCL's multi-turn checker, which re-runs the episode and the ground truth."""
    from deltattg.envs.bfcl import BFCLEnv

    env = BFCLEnv()
    return [_play(env, env.tasks("base")[:episodes], env.expert_action, "bfcl", "ground truth")]


def bench_tau2(episodes: int = 40) -> list[Row]:
    """τ²-bench retail (``retail/train``, the first ``episodes`` tasks): the gold actions replayed, one per step;
    the last step includes τ²'s own evaluation of the episode's database and communicated info."""
    from deltattg.envs.tau2 import Tau2Env

    env = Tau2Env()
    return [_play(env, env.tasks("retail/train")[:episodes], env.expert_action, "tau2", "gold actions")]


def bench_awm(episodes: int = 6) -> list[Row]:
    """AWM on our example scenarios (``deltattg awm-examples``; every task of both, repeated up to ``episodes``):
    the gold calls replayed. The scenario's MCP server starts at an episode's first step (a process of its own)
    and a fresh MCP session serves each call; the last step runs the task's verifier on the databases."""
    import itertools

    from deltattg.envs.awm import AWMEnv
    from deltattg.envs.awm.examples import shipped_release

    env = AWMEnv(shipped_release())
    try:
        tasks = list(itertools.islice(itertools.cycle(env.tasks("all")), episodes))
        return [_play(env, tasks, env.expert_action, "awm", "gold calls")]
    finally:
        env.close()


# name -> (benchmark, modules its optional extra provides)
BENCHMARKS: dict[str, tuple[Callable[..., list[Row]], tuple[str, ...]]] = {
    "household": (bench_household, ()),
    "search": (bench_search, ("bm25s",)),
    "alfworld": (bench_alfworld, ("alfworld", "textworld")),
    "bfcl": (bench_bfcl, ("bfcl_eval",)),
    "tau2": (bench_tau2, ("tau2",)),
    "awm": (bench_awm, ("fastapi_mcp",)),
}


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, help="episodes per benchmark (default: each benchmark's own)")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append", help="run only these (repeatable)")
    parser.add_argument("--summary", type=Path, help="also write the table as a summary (bench/summary.py)")
    args = parser.parse_args(argv)
    command = ["bench/bench_envs.py", *(sys.argv[1:] if argv is None else argv)]  # now: ALFWorld rewrites sys.argv
    rows = [HEADER]
    for name in args.only or BENCHMARKS:
        bench, modules = BENCHMARKS[name]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            print(f"skipping {name}: {', '.join(missing)} not installed")
            continue
        try:
            rows += [row.cells() for row in bench(**({} if args.episodes is None else {"episodes": args.episodes}))]
        except FileNotFoundError as error:  # an extra's data is missing (ALFWorld: $ALFWORLD_DATA)
            print(f"skipping {name}: {error}")
    print(_table(rows))
    if args.summary:
        from deltattg.summaries import write_summary

        write_summary(args.summary, "bench_envs", command, {"steps": (HEADER, rows[1:])})


if __name__ == "__main__":
    main()
