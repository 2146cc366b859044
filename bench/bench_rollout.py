"""Rollout throughput on CPU (issue 4, item 8): generated tokens per second of the batched rollout engine on the
built-in household environment, for a tiny word-level Llama actor and for SmolLM2-135M-Instruct (offline).

Each run plays ``--episodes`` episodes (one batched generate call per turn over all unfinished episodes) for at most
``--turns`` turns, sampling at temperature 1. Reported: generated tokens, wall seconds, tokens/s, turns/s, and the
share of wall time spent inside the environments.

    .venv/bin/python bench/bench_rollout.py [--episodes 32] [--turns 5] [--threads 0] [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import time

import torch

from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.train.actor import prompt_words
from deltattg.rollout.prompts import PromptConfig

CONFIG = HouseholdConfig.short()


class TimedEnv(HouseholdEnv):
    """The household environment, accumulating the wall time its ``step`` calls take."""

    spent = 0.0

    def step(self, action):
        start = time.perf_counter()
        try:
            return super().step(action)
        finally:
            TimedEnv.spent += time.perf_counter() - start


def measure(policy: LMPolicy, episodes: int, turns: int) -> tuple[int, int, float, float]:
    """(generated tokens, actions, wall seconds, environment seconds) for one batched rollout."""
    tasks = HouseholdEnv(CONFIG).tasks("train")[:episodes]
    TimedEnv.spent = 0.0
    torch.manual_seed(0)
    start = time.perf_counter()
    trajectories = run_episodes(lambda: TimedEnv(CONFIG), tasks, policy, max_turns=turns)
    seconds = time.perf_counter() - start
    tokens = sum(sum(t.step_tokens or []) for t in trajectories)
    return tokens, sum(t.num_steps for t in trajectories), seconds, TimedEnv.spent


def tiny_policy(max_new_tokens: int) -> LMPolicy:
    from deltattg.tiny import tiny_llama, word_tokenizer

    tokenizer = word_tokenizer([*vocabulary(CONFIG), *prompt_words(PromptConfig(), CONFIG.max_steps)])
    model = tiny_llama(tokenizer, hidden=128, layers=2, heads=4).eval()
    return LMPolicy(model, tokenizer, SamplingConfig(max_new_tokens=max_new_tokens), name="tiny h128x2")


def smollm2_policy(max_new_tokens: int) -> LMPolicy:
    from deltattg.hf import load_causal_lm, load_tokenizer

    return LMPolicy(load_causal_lm("smollm2").eval(), load_tokenizer("smollm2"),
                    SamplingConfig(max_new_tokens=max_new_tokens), name="SmolLM2-135M")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    builders = [tiny_policy] + ([] if args.skip_smollm2 else [smollm2_policy])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.episodes} episodes x <= {args.turns} "
          f"turns, <= {args.max_new_tokens} new tokens per action, household short config")
    print(f"{'actor':>14}  {'tokens':>7}  {'actions':>7}  {'wall s':>7}  {'tokens/s':>9}  {'actions/s':>9}  {'env share':>9}")
    for build in builders:
        policy = build(args.max_new_tokens)
        measure(policy, 2, 1)  # warm-up
        tokens, actions, seconds, env_seconds = measure(policy, args.episodes, args.turns)
        print(f"{policy.name:>14}  {tokens:>7}  {actions:>7}  {seconds:>7.2f}  {tokens / seconds:>9.1f}  "
              f"{actions / seconds:>9.1f}  {100 * env_seconds / seconds:>8.2f}%")


if __name__ == "__main__":
    main()
