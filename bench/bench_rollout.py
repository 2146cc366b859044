"""Rollout throughput on CPU (issue 4, item 8): generated tokens per second of the batched rollout engine on the
built-in household environment, for a tiny word-level Llama actor and for SmolLM2-135M-Instruct (offline).

Each run plays ``--episodes`` episodes (one batched generate call per turn over all unfinished episodes) for at most
``--turns`` turns, sampling at temperature 1. Reported: generated tokens, wall seconds, tokens/s, turns/s, and the
share of wall time spent inside the environments.

``--memory`` instead compares peak memory of the two ways of recording sampled tokens' log-probs (issue 12, item 7),
each in a fresh process: SmolLM2 plays one turn of ``--memory-rows`` household episodes (half as many tasks, each
twice: a shared prefill), forced to ``--memory-tokens`` new tokens (no end-of-sequence id can match). Peers:
``output-logits`` keeps generate's fp32 logits of every step and takes the log-softmax at the end (the code before
the item); ``on-the-fly`` is ``LMPolicy`` (``SampledLogprobs``: one step's distribution at a time). Reported: the
peak resident memory while generating (Linux VmHWM, reset after loading) above the loaded process, the bytes of the
stored logits (rows x tokens x vocabulary x 4), and that times the measured overhead ratio extrapolated to Table 4's
batch (64 x 1024 tokens) for Qwen3's 151,936-token vocabulary; both peers' tokens and log-probs must agree.

``--prefix-cache N`` instead times SmolLM2 ReAct episodes (greedy) on ``--env`` two ways in one process, peers in
turn: batched prompts (``SamplingConfig.prefix_cache = 0``, the default) vs one prompt at a time prefilled only past
the longest prefix it shares with one of the N most recent conversations. Reported: wall and process-CPU seconds of
each, the ratio cached ÷ batched, prompt tokens, and whether both chose the same actions. On BFCL / τ² (extras
``[bfcl]`` / ``[tau2]``) every prompt starts with a system prompt of thousands of tokens.

    .venv/bin/python bench/bench_rollout.py [--episodes 32] [--turns 5] [--threads 0] [--skip-smollm2]
    .venv/bin/python bench/bench_rollout.py --memory [--memory-rows 4] [--memory-tokens 1024] [--threads 0]
    .venv/bin/python bench/bench_rollout.py --prefix-cache 8 --env bfcl --split base --episodes 2 --turns 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.report import text_table
from deltattg.summaries import write_summary
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


class OutputLogitsPolicy(LMPolicy):
    """The reference peer: log-probs from generate's stored logits of every step, as ``LMPolicy`` took them before
    issue 12 item 7 (``[rows, tokens, vocabulary]`` fp32 kept until the end)."""

    def sample(self, input_ids, attention, cache, pad, keep_cache=False):
        s = self.sampling
        greedy = s.temperature <= 0
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention, **cache, do_sample=not greedy,
            temperature=None if greedy else s.temperature, top_p=None if greedy else s.top_p, top_k=None,
            max_new_tokens=s.max_new_tokens, pad_token_id=pad, eos_token_id=self.eos_ids,
            return_dict_in_generate=True, output_logits=True,
        )  # fmt: skip
        generated = out.sequences[:, input_ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float() / (1.0 if greedy else s.temperature)
        return generated, torch.log_softmax(logits, dim=-1).gather(-1, generated[..., None])[..., 0], None


MEMORY_PEERS = {"output-logits": OutputLogitsPolicy, "on-the-fly": LMPolicy}
QWEN3_VOCAB, TABLE4_ROWS, TABLE4_TOKENS = 151_936, 64, 1024


def proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory_peer(peer: str, rows: int, tokens: int) -> dict:
    """One peer's generate peak in this (fresh) process: loaded-process RSS, peak RSS while generating, outputs."""
    from deltattg.hf import load_causal_lm, load_tokenizer

    model = load_causal_lm("smollm2").eval()
    policy = MEMORY_PEERS[peer](model, load_tokenizer("smollm2"), SamplingConfig(max_new_tokens=tokens), name=peer)
    policy.eos_ids = [model.config.vocab_size]  # no sampled id matches: every row runs to ``tokens``
    tasks = HouseholdEnv(CONFIG).tasks("train")[: rows // 2]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark (VmHWM) past loading
    loaded = proc_status_kib("VmRSS")
    torch.manual_seed(0)
    start = time.perf_counter()
    trajectories = run_episodes(lambda: HouseholdEnv(CONFIG), tasks, policy, group_size=2, max_turns=1)
    seconds = time.perf_counter() - start
    steps = [t.steps[0] for t in trajectories]
    return {"loaded_kib": loaded, "peak_kib": proc_status_kib("VmHWM"), "seconds": seconds,
            "vocab": model.config.vocab_size, "token_ids": [s.token_ids for s in steps],
            "logprobs": [s.logprobs for s in steps]}  # fmt: skip


MEMORY_COLUMNS = ("peer", "loaded MiB", "peak MiB", "generate MiB", "wall s")
MEMORY_SCALE_COLUMNS = ("quantity", "value")


def compare_memory(rows: int, tokens: int, threads: int) -> dict[str, tuple]:
    """Run each peer in a fresh process; their peaks side by side, the ratio and the extrapolation (two tables)."""
    results = {}
    for peer in MEMORY_PEERS:
        command = [sys.executable, __file__, "--memory-peer", peer, "--memory-rows", str(rows),
                   "--memory-tokens", str(tokens), "--threads", str(threads)]  # fmt: skip
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[peer] = json.loads(output.strip().splitlines()[-1])
    old, new = results["output-logits"], results["on-the-fly"]
    assert old["token_ids"] == new["token_ids"] and all(len(t) == tokens for t in new["token_ids"])
    worst = max(abs(a - b) for x, y in zip(old["logprobs"], new["logprobs"]) for a, b in zip(x, y))
    mib = 1 / 1024
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SmolLM2-135M, {rows} rows x {tokens} new "
          f"tokens, one turn (shared prefill)")
    peers = [[peer, f"{r['loaded_kib'] * mib:.0f}", f"{r['peak_kib'] * mib:.0f}",
              f"{(r['peak_kib'] - r['loaded_kib']) * mib:.0f}", f"{r['seconds']:.1f}"] for peer, r in results.items()]
    extra = {peer: (r["peak_kib"] - r["loaded_kib"]) * 1024 for peer, r in results.items()}
    logits = rows * tokens * new["vocab"] * 4
    overhead = (extra["output-logits"] - extra["on-the-fly"]) / logits
    table4 = TABLE4_ROWS * TABLE4_TOKENS * QWEN3_VOCAB * 4
    scale = [
        ["same sampled tokens; max |log-prob difference|", f"yes; {worst:.1e}"],
        ["generate peak, output-logits ÷ on-the-fly", f"{extra['output-logits'] / extra['on-the-fly']:.1f}x"],
        [f"stored logits, {rows} x {tokens} x {new['vocab']} x 4 B", f"{logits / 2**30:.2f} GiB"],
        ["peak saved ÷ stored logits", f"{overhead:.2f}"],
        [f"Table 4 batch, Qwen3 vocabulary: stored logits {TABLE4_ROWS} x {TABLE4_TOKENS} x {QWEN3_VOCAB} x 4 B",
         f"{table4 / 2**30:.1f} GiB"],
        ["Table 4 batch: peak saved", f"≈ {overhead * table4 / 2**30:.0f} GiB"],
        [f"Table 4 batch: one step's log-softmax on the fly, {TABLE4_ROWS} x {QWEN3_VOCAB} x 4 B",
         f"{TABLE4_ROWS * QWEN3_VOCAB * 4 / 2**20:.0f} MiB"],
    ]  # fmt: skip
    return {"memory": (MEMORY_COLUMNS, peers), "memory_scale": (MEMORY_SCALE_COLUMNS, scale)}


class PromptCountingPolicy(LMPolicy):
    """``LMPolicy`` counting the prompt tokens it was given."""

    prompt_tokens = 0

    def act(self, episodes):
        actions = super().act(episodes)
        self.prompt_tokens += sum(len(a.prompt_ids or []) for a in actions)
        return actions


PREFIX_COLUMNS = ("peer", "wall s", "CPU s", "actions", "prompt tokens", "wall ÷ batched", "CPU ÷ batched",
                  "actions = batched's")  # fmt: skip


def compare_prefix_cache(args: argparse.Namespace) -> dict[str, tuple]:
    from deltattg.envs.registry import env_factory
    from deltattg.hf import load_causal_lm, load_tokenizer

    make_env = env_factory(args.env, size="short" if args.env == "household" else "full")
    probe = make_env()
    tasks = list(probe.tasks(args.split))[: args.episodes]
    prompt = PromptConfig(layout=getattr(probe, "prompt_layout", "window"), react=True)
    model, tokenizer = load_causal_lm("smollm2").eval(), load_tokenizer("smollm2")
    print(f"SmolLM2-135M ReAct, greedy, {args.env} {args.split}: {len(tasks)} episodes x <= {args.turns} turns, "
          f"<= {args.max_new_tokens} new tokens; torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows, base = [], None
    for name, cache in (("batched", 0), (f"prefix cache {args.prefix_cache}", args.prefix_cache)):
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens, prefix_cache=cache)
        policy = PromptCountingPolicy(model, tokenizer, sampling, prompt, name=name)
        wall, cpu = time.perf_counter(), time.process_time()
        trajectories = run_episodes(make_env, tasks, policy, max_turns=args.turns)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        actions = [[m["content"] for m in t.messages or [] if m["role"] == "assistant"] for t in trajectories]
        base = base or (wall, cpu, actions)
        rows.append([name, f"{wall:.1f}", f"{cpu:.1f}", sum(map(len, actions)), f"{policy.prompt_tokens:,}",
                     f"{wall / base[0]:.3f}", f"{cpu / base[1]:.3f}", "yes" if actions == base[2] else "no"])  # fmt: skip
    return {"prefix_cache": (PREFIX_COLUMNS, rows)}


THROUGHPUT_COLUMNS = ("actor", "tokens", "actions", "wall s", "tokens/s", "actions/s", "environment share %")


def compare_throughput(args: argparse.Namespace) -> dict[str, tuple]:
    builders = [tiny_policy] + ([] if args.skip_smollm2 else [smollm2_policy])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.episodes} episodes x <= {args.turns} "
          f"turns, <= {args.max_new_tokens} new tokens per action, household short config")
    rows = []
    for build in builders:
        policy = build(args.max_new_tokens)
        measure(policy, 2, 1)  # warm-up
        tokens, actions, seconds, env_seconds = measure(policy, args.episodes, args.turns)
        rows.append([policy.name, tokens, actions, f"{seconds:.2f}", f"{tokens / seconds:.1f}", f"{actions / seconds:.1f}",
                     f"{100 * env_seconds / seconds:.2f}"])  # fmt: skip
    return {"throughput": (THROUGHPUT_COLUMNS, rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--memory", action="store_true", help="compare log-prob recording peak memory instead")
    parser.add_argument("--memory-rows", type=int, default=4, help="rows per generate call (even)")
    parser.add_argument("--memory-tokens", type=int, default=1024, help="new tokens per row")
    parser.add_argument("--memory-peer", choices=MEMORY_PEERS, help=argparse.SUPPRESS)  # one peer's fresh process
    parser.add_argument("--prefix-cache", type=int, metavar="N", help="compare --prefix-cache N with batched prompts")
    parser.add_argument("--env", default="household", help="--prefix-cache: household, bfcl or tau2")
    parser.add_argument("--split", default="train", help="--prefix-cache: the task split")
    parser.add_argument("--summary", help="the tables also as a summary (deltattg.summaries)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_peer:
        print(json.dumps(memory_peer(args.memory_peer, args.memory_rows, args.memory_tokens)))
        return
    if args.prefix_cache:
        tables = compare_prefix_cache(args)
    elif args.memory:
        tables = compare_memory(args.memory_rows, args.memory_tokens, args.threads)
    else:
        tables = compare_throughput(args)
    print("\n\n".join(text_table(*columns_rows) for columns_rows in tables.values()))
    if args.summary:
        write_summary(args.summary, "bench_rollout", ["bench/bench_rollout.py", *sys.argv[1:]], tables)


if __name__ == "__main__":
    main()
