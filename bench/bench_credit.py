"""Credit-assignment benchmark on a verl-agent ALFWorld-sized batch in the flat token-row layout (issue 2, item 7).

What is measured, all on the same synthetic batch in one process (default 16 prompts × 8 rollouts × ≤ 50 steps, one
step per row, 128 response tokens per row; mixed outcomes, rewards 0/1, fixed seed; built outside the timed region):

  (a) ``deltattg``  — our DeltaTTG estimator end to end through ``credit_flat``: factorising the string uids, locating
                      the steps, Eq. 14 group advantages, Δ/mass/ρ, B_M and the per-token broadcast (what a trainer calls);
  (b) ``verl-grpo`` — verl 0.9.1 ``core_algos.compute_grpo_outcome_advantage`` exactly as verl calls it: the episode
                      reward on the last valid token of each row, ``index`` a numpy object array of uid strings;
  (c) ``literal``   — ``deltattg.credit.reference.algorithm1``, the per-trajectory Python transcription of Algorithm 1,
                      on the same flat batch: reading steps and trajectories out of the rows, the algorithm, and
                      writing the ``[rows, L]`` token advantages (same input and output as (a) and (b));
  (c') ``literal core`` — the same algorithm on per-trajectory lists built outside the timed region (its inner loop
                      only, per-token output as lists) — a lower bound on what any Python transcription costs;
  (d) ``grpo``      — our GRPO estimator through ``credit_flat`` (for reference).

Each is warmed up, then timed ``--repeats`` times; the table gives the wall-clock median and min and the process-CPU
median; the ratios use the wall-clock medians. torch runs single-threaded unless ``--threads`` says otherwise: on a small
shared CPU, multi-threaded kernels stall on descheduled peers. Timings on a shared machine are noisy — compare medians,
and rerun. Outside the timed region the script checks that (a) and (c) give the same per-token advantages (to 1e-4)
and, when verl is present, that (d) and (b) do too.

verl 0.9.1 pins ``transformers<5.11``, so it lives in its own venv (see ``bench/README.md``)::

    .venv-verl/bin/python bench/bench_credit.py          # all four, last line: deltattg/verl-grpo time ratio: X
    .venv/bin/python bench/bench_credit.py               # without verl: (a), (c), (d); the ratio reads n/a
    .venv-verl/bin/python bench/bench_credit.py --profile  # plus a per-stage breakdown and torch ops of (a)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from deltattg.credit import CreditConfig, Fallback, MeterReadings, StepBatch
from deltattg.credit.layouts import credit_flat, factorize, locate_steps, meter_readings, per_trajectory, token_advantages
from deltattg.credit.reference import algorithm1
from deltattg.credit.registry import get_estimator
from deltattg.data.trajectory import MeterOutput

DELTATTG = "(a) deltattg (credit_flat)"
VERL = "(b) verl 0.9.1 GRPO"
LITERAL = "(c) literal Algorithm 1"
LITERAL_CORE = "(c') literal core, lists prebuilt"
GRPO = "(d) grpo (credit_flat)"

VERL_HINT = (
    "verl 0.9.1 is not importable in this interpreter. Get it in its own venv (it pins transformers<5.11):\n"
    "  python3 -m venv .venv-verl && .venv-verl/bin/pip install torch==2.13.0\n"
    "  .venv-verl/bin/pip install --no-deps verl==0.9.1\n"
    "  .venv-verl/bin/pip install torch==2.13.0 'ray>=2.41' 'transformers>=5.5.3,<5.11,!=5.6.0' \\\n"
    "      'tensordict>=0.8,<=0.10,!=0.9.0' omegaconf codetiming numpy tqdm pyyaml\n"
    "  .venv-verl/bin/pip install --no-deps -e .\n"
    "then run: .venv-verl/bin/python bench/bench_credit.py   (or: make bench-credit)"
)


# ----------------------------------------------------------------------------------------------------- the batch


@dataclass
class Trajectories:
    """The synthetic batch per trajectory, as plain Python lists (what ``algorithm1`` takes)."""

    groups: list[str]  # uid string of each trajectory's group
    ids: list[str]  # trajectory uid strings
    rewards: list[float]
    successes: list[bool]
    step_tokens: list[list[int]]  # response tokens of each step (= the valid length of its row)
    meter: list[list[MeterOutput | None]]  # one reading per decision state; None = invalid


@dataclass
class FlatBatch:
    """The same batch as flat token rows, one step per row, trajectories contiguous (as verl-agent gathers them)."""

    response_mask: Tensor  # [rows, L] int64, 1 for the first n_t tokens of the row
    group_ids: np.ndarray  # [rows] object array of uid strings (verl's ``index``)
    traj_ids: np.ndarray  # [rows] object array of trajectory uid strings
    reward: Tensor  # [rows] float32, the trajectory's reward on each of its rows
    success: Tensor  # [rows] bool
    token_level_rewards: Tensor  # [rows, L] float32, the reward on the last valid token of each row (verl)
    meter: MeterReadings  # [n_traj, max_steps], trajectories in order of first appearance


def group_outcomes(rng: np.random.Generator, prompts: int, rollouts: int) -> list[list[bool]]:
    """Success flags per group: about 1/8 of the groups all-success, 1/8 all-fail, the rest mixed (≥ 1 of each)."""
    uniform = max(1, prompts // 8) if prompts >= 3 else 0
    kinds = rng.permutation(["all_success"] * uniform + ["all_fail"] * uniform + ["mixed"] * (prompts - 2 * uniform))
    outcomes = []
    for kind in kinds:
        if kind == "all_success":
            outcomes.append([True] * rollouts)
        elif kind == "all_fail":
            outcomes.append([False] * rollouts)
        else:
            flags = list(rng.random(rollouts) < 0.5)
            flags[0], flags[-1] = True, False if rollouts > 1 else True
            outcomes.append([bool(f) for f in rng.permutation(flags)])
    return outcomes


def trajectory_length(rng: np.random.Generator, max_steps: int, short_rate: float = 0.3) -> int:
    """Most trajectories use the whole step budget; ``short_rate`` of them end early (uniform in [1, max − 1])."""
    if max_steps > 1 and rng.random() < short_rate:
        return int(rng.integers(1, max_steps))
    return max_steps


def meter_row(rng: np.random.Generator, steps: int) -> list[MeterOutput | None]:
    """Random valid readings for one trajectory; about 3% of trajectories predict failure at every state."""
    p_complete = 0.0 if rng.random() < 0.03 else float(rng.uniform(0.3, 0.95))
    row: list[MeterOutput | None] = []
    for _ in range(steps):
        if rng.random() < p_complete:
            row.append(MeterOutput(can_complete=True, tokens_to_go=float(rng.integers(0, 6000))))
        else:
            row.append(MeterOutput(can_complete=False, tokens_to_go=None))
    return row


def make_trajectories(
    prompts: int, rollouts: int, max_steps: int, response_len: int, seed: int, invalid_readings: int
) -> Trajectories:
    """The per-trajectory lists; uids are uuid4 strings as verl makes them (from a seeded generator)."""
    rng = np.random.default_rng(seed)
    make_uid = lambda: str(uuid.UUID(bytes=rng.bytes(16), version=4))  # noqa: E731
    out = Trajectories([], [], [], [], [], [])
    for flags in group_outcomes(rng, prompts, rollouts):
        group = make_uid()
        for success in flags:
            steps = trajectory_length(rng, max_steps)
            out.groups.append(group)
            out.ids.append(make_uid())
            out.rewards.append(1.0 if success else 0.0)
            out.successes.append(success)
            out.step_tokens.append([int(n) for n in rng.integers(1, response_len + 1, size=steps)])
            out.meter.append(meter_row(rng, steps))
    invalidate_readings(rng, out.meter, invalid_readings)
    return out


def invalidate_readings(rng: np.random.Generator, meter: list[list[MeterOutput | None]], count: int) -> None:
    """Replace ``count`` readings at random states by None (invalid meter output)."""
    states = [(i, t) for i, row in enumerate(meter) for t in range(len(row))]
    for k in rng.choice(len(states), size=min(count, len(states)), replace=False):
        i, t = states[k]
        meter[i][t] = None


def flatten(trajs: Trajectories, response_len: int) -> FlatBatch:
    """One row per step, trajectories contiguous; right padding as in verl's responses."""
    lengths = torch.tensor([n for row in trajs.step_tokens for n in row])
    rows_per_traj = [len(row) for row in trajs.step_tokens]
    response_mask = (torch.arange(response_len)[None, :] < lengths[:, None]).long()
    repeat = lambda values: np.repeat(np.array(values, dtype=object), rows_per_traj)  # noqa: E731
    reward = torch.tensor(np.repeat(trajs.rewards, rows_per_traj), dtype=torch.float32)
    success = torch.tensor(np.repeat(trajs.successes, rows_per_traj), dtype=torch.bool)
    token_level_rewards = torch.zeros(len(lengths), response_len)
    token_level_rewards[torch.arange(len(lengths)), lengths - 1] = reward
    return FlatBatch(
        response_mask=response_mask,
        group_ids=repeat(trajs.groups),
        traj_ids=repeat(trajs.ids),
        reward=reward,
        success=success,
        token_level_rewards=token_level_rewards,
        meter=meter_readings(trajs.meter, max(rows_per_traj)),
    )


# ----------------------------------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """Wall-clock and process-CPU seconds of each timed call."""

    name: str
    seconds: list[float]
    cpu_seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)


def time_call(name: str, fn: Callable[[], Any], warmup: int, repeats: int) -> tuple[Timing, Any]:
    """Median-ready wall times of ``fn`` after ``warmup`` untimed calls; also returns the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    seconds, cpu_seconds = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = fn()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    return Timing(name, seconds, cpu_seconds), result


def import_verl_grpo() -> Callable[..., tuple[Tensor, Tensor]] | None:
    """verl's ``compute_grpo_outcome_advantage``, or None when verl is not importable here."""
    try:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    except ImportError:
        return None
    return compute_grpo_outcome_advantage


def estimators(
    flat: FlatBatch, trajs: Trajectories, config: CreditConfig, verl_grpo: Callable[..., Any] | None
) -> dict[str, Callable[[], Any]]:
    """The timed calls, by row label of the table."""
    ours = lambda method: lambda: credit_flat(  # noqa: E731
        method, flat.response_mask, flat.group_ids, flat.traj_ids, flat.reward, flat.success, config, flat.meter
    )
    calls: dict[str, Callable[[], Any]] = {DELTATTG: ours("deltattg")}
    if verl_grpo is not None:
        calls[VERL] = lambda: verl_grpo(  # exactly verl's call: string uids as a numpy object array
            flat.token_level_rewards, flat.response_mask, flat.group_ids,
            epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None,
        )
    calls[LITERAL] = lambda: literal_on_flat(flat, config)
    calls[LITERAL_CORE] = lambda: algorithm1(
        trajs.rewards, trajs.successes, trajs.groups, trajs.step_tokens, trajs.meter, config
    )
    calls[GRPO] = ours("grpo")
    return calls


def literal_on_flat(flat: FlatBatch, config: CreditConfig) -> Tensor:
    """Algorithm 1 transcribed literally over the flat batch: Python loops read each row's runs of 1s as steps, group
    rows into trajectories, run ``algorithm1``, then write A_i·w_t into every token of the ``[rows, L]`` output."""
    mask = flat.response_mask.tolist()
    traj_ids, group_ids = flat.traj_ids.tolist(), flat.group_ids.tolist()
    reward, success = flat.reward.tolist(), flat.success.tolist()
    order: dict[str, int] = {}
    steps: list[list[tuple[int, int, int]]] = []  # per trajectory: (row, start, end) of each step
    rewards, successes, groups = [], [], []
    for row, bits in enumerate(mask):
        i = order.setdefault(traj_ids[row], len(order))
        if i == len(steps):
            steps.append([])
            rewards.append(reward[row]), successes.append(success[row]), groups.append(group_ids[row])
        start = None
        for k, bit in enumerate(bits + [0]):
            if bit and start is None:
                start = k
            elif not bit and start is not None:
                steps[i].append((row, start, k))
                start = None
    valid, can, ttg = flat.meter.valid.tolist(), flat.meter.can_complete.tolist(), flat.meter.tokens_to_go.tolist()
    meter = [[MeterOutput(can[i][t], ttg[i][t] if can[i][t] else None) if valid[i][t] else None
              for t in range(len(steps[i]))] for i in range(len(steps))]
    step_tokens = [[end - start for _, start, end in row] for row in steps]
    advantage, weights, _ = algorithm1(rewards, successes, groups, step_tokens, meter, config)
    out = [[0.0] * len(bits) for bits in mask]
    for i, row in enumerate(steps):
        for t, (r, start, end) in enumerate(row):
            for k in range(start, end):
                out[r][k] = advantage[i] * weights[i][t]
    return torch.tensor(out)


# ----------------------------------------------------------------------------------------------------- checks


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def literal_tokens(token_advantages_per_traj: list[list[float]]) -> Tensor:
    """The literal loop's per-token output, concatenated in trajectory order (= flat rows' valid tokens in row order)."""
    return torch.tensor([x for row in token_advantages_per_traj for x in row], dtype=torch.float64)


def rows_in_group(group_ids: np.ndarray) -> np.ndarray:
    """For each row, how many rows share its group id."""
    _, inverse, counts = np.unique(group_ids, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)]


def check_agreement(results: dict[str, Any], flat: FlatBatch, tol: float = 1e-4) -> list[str]:
    """Per-token agreement (a) vs (c), and (d) vs (b) when verl ran; one printed line each."""
    valid = flat.response_mask.bool()
    ours = results[DELTATTG][0][valid]
    lines = []
    for name, literal in ((LITERAL, results[LITERAL][valid]), (LITERAL_CORE, literal_tokens(results[LITERAL_CORE][2]))):
        if ours.numel() != literal.numel():
            return [f"check (a) vs {name}: FAILED — {ours.numel()} vs {literal.numel()} tokens"]
        diff = max_abs_diff(ours, literal)
        lines.append(f"check (a) deltattg vs {name.split()[0]} literal, per-token advantages: max |diff| = {diff:.2e} "
                     f"over {ours.numel():,} tokens -> {'OK' if diff <= tol else 'FAILED'} (tol {tol:g})")
    if VERL in results:
        # verl scores a group of one row against mean 0 / std 1 (ours: no relative signal, 0); compare the others.
        multi = torch.from_numpy(rows_in_group(flat.group_ids) > 1)
        diff = max_abs_diff(results[GRPO][0][multi], results[VERL][0][multi])
        skipped = f", {int((~multi).sum())} one-row-group rows skipped" if not multi.all() else ""
        lines.append(f"check (d) grpo vs (b) verl GRPO, per-token advantages: max |diff| = {diff:.2e} "
                     f"-> {'OK' if diff <= tol else 'FAILED'} (tol {tol:g}{skipped})")
    return lines


def fallback_summary(credit_fallback: Tensor) -> str:
    counts = torch.bincount(credit_fallback.long(), minlength=len(Fallback))
    return ", ".join(f"{f.name.lower()} {int(counts[f])}" for f in Fallback if counts[f])


# ----------------------------------------------------------------------------------------------------- profiling


def stage_breakdown(flat: FlatBatch, config: CreditConfig, warmup: int, repeats: int) -> list[Timing]:
    """Median time of each stage of ``credit_flat('deltattg', ...)``, called one by one (same code, same inputs)."""
    traj_of_row, _ = factorize(flat.traj_ids)
    group_of_row, _ = factorize(flat.group_ids)
    steps = locate_steps(flat.response_mask, traj_of_row)
    n = steps.num_trajectories

    def batch() -> StepBatch:
        return StepBatch(
            reward=per_trajectory(flat.reward.float(), traj_of_row, n),
            success=per_trajectory(flat.success.bool(), traj_of_row, n),
            group=per_trajectory(group_of_row, traj_of_row, n),
            step_tokens=steps.step_tokens,
            step_mask=steps.step_mask,
            meter=flat.meter,
        )

    step_batch = batch()
    credit = get_estimator("deltattg")(step_batch, config)
    stages: dict[str, Callable[[], Any]] = {
        "factorize(traj_ids) [uid strings]": lambda: factorize(flat.traj_ids),
        "factorize(group_ids) [uid strings]": lambda: factorize(flat.group_ids),
        "locate_steps": lambda: locate_steps(flat.response_mask, traj_of_row),
        "per-trajectory StepBatch": batch,
        "estimator deltattg (Eq.14..B_M)": lambda: get_estimator("deltattg")(step_batch, config),
        "token_advantages (broadcast)": lambda: token_advantages(credit.step_advantages, steps, flat.response_mask),
    }
    return [time_call(name, fn, warmup, repeats)[0] for name, fn in stages.items()]


def torch_ops(fn: Callable[[], Any], calls: int = 10, top: int = 12) -> str:
    """torch.profiler table of ``calls`` calls of ``fn``: the aten ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


# ----------------------------------------------------------------------------------------------------- report


def table(timings: list[Timing]) -> str:
    """Wall median / wall min / process-CPU median in ms (CPU time is less sensitive to other jobs on the machine)."""
    width = max(len(t.name) for t in timings)
    lines = [f"{'':{width}}  {'median ms':>10}  {'min ms':>10}  {'cpu med ms':>10}"]
    lines += [f"{t.name:{width}}  {t.median * 1e3:10.3f}  {t.best * 1e3:10.3f}  {t.cpu_median * 1e3:10.3f}" for t in timings]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prompts", type=int, default=16, help="groups (prompts) in the batch")
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt (group size G)")
    p.add_argument("--max-steps", type=int, default=50, help="step limit per trajectory (one step per row)")
    p.add_argument("--response-len", type=int, default=128, help="response tokens per row (L)")
    p.add_argument("--invalid-readings", type=int, default=3, help="invalid meter readings placed at random states")
    p.add_argument("--failure-cost", type=float, default=16384.0, help="failure cost C (ALFWorld: 16384)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per estimator (the median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up calls per estimator")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic batch")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads; 0 = torch's default. 1 by default: on a small shared CPU, multi-threaded "
                        "kernels stall on descheduled peers and the timings become meaningless")
    p.add_argument("--profile", action="store_true", help="also print a per-stage breakdown and the torch ops of (a)")
    p.add_argument("--summary", help="also write the timings and ratios as a summary (deltattg.summaries)")
    args = p.parse_args(argv)
    sizes = (args.prompts, args.rollouts, args.max_steps, args.response_len, args.repeats)
    if min(sizes) < 1 or min(args.warmup, args.threads, args.invalid_readings) < 0:
        p.error("sizes and --repeats must be >= 1; --warmup, --threads and --invalid-readings >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    trajs = make_trajectories(
        args.prompts, args.rollouts, args.max_steps, args.response_len, args.seed, args.invalid_readings
    )
    flat = flatten(trajs, args.response_len)
    config = CreditConfig(rho=0.2, cap=5.0, failure_cost=args.failure_cost)
    verl_grpo = import_verl_grpo()

    rows, tokens = flat.response_mask.shape[0], int(flat.response_mask.sum())
    print(f"batch: {args.prompts} prompts x {args.rollouts} rollouts, <= {args.max_steps} steps, one step per row: "
          f"{rows:,} rows x {args.response_len} tokens ({tokens:,} valid), {len(trajs.ids)} trajectories, seed {args.seed}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.warmup} warm-up + {args.repeats} timed calls each; ratios use wall-clock medians (shared CPU: noisy)")
    if verl_grpo is None:
        print(VERL_HINT)

    timings, results = [], {}
    for name, fn in estimators(flat, trajs, config, verl_grpo).items():
        timing, results[name] = time_call(name, fn, args.warmup, args.repeats)
        timings.append(timing)
    print("fallbacks (deltattg): " + fallback_summary(results[DELTATTG][1].fallback))
    for line in check_agreement(results, flat):
        print(line)

    if args.profile:
        print("\nstage breakdown of (a):\n" + table(stage_breakdown(flat, config, args.warmup, args.repeats)))
        print("\ntorch ops of (a), 10 calls, by self CPU time:")
        print(torch_ops(estimators(flat, trajs, config, None)[DELTATTG]))

    print("\n" + table(timings))
    ratios = ratio_lines(timings, verl_present=verl_grpo is not None)
    for line in ratios:
        print(line)
    if args.summary:
        from deltattg.summaries import write_summary

        rows = [[t.name, f"{t.median * 1e3:.3f}", f"{t.best * 1e3:.3f}", f"{t.cpu_median * 1e3:.3f}"] for t in timings]
        measured = [line.rsplit(": ", 1) for line in ratios if ": " in line and not line.startswith("goals")]
        command = ["bench/bench_credit.py", *(sys.argv[1:] if argv is None else argv)]
        write_summary(args.summary, "bench_credit", command, {
            "timings": (("estimator", "median ms", "min ms", "cpu median ms"), rows),
            "ratios": (("ratio", "value"), measured)})  # fmt: skip


def ratio_lines(timings: list[Timing], verl_present: bool) -> list[str]:
    """The goals, the ratios on CPU medians, then the headline ratios on wall medians (the ratio line last)."""
    wall = {t.name: t.median for t in timings}
    cpu = {t.name: t.cpu_median for t in timings}
    cpu_ratios = f"literal/deltattg {cpu[LITERAL] / cpu[DELTATTG]:.1f} (core only {cpu[LITERAL_CORE] / cpu[DELTATTG]:.1f})"
    if verl_present:
        cpu_ratios += f", deltattg/verl-grpo {cpu[DELTATTG] / cpu[VERL]:.3f}"
    verl_ratio = f"{wall[DELTATTG] / wall[VERL]:.3f}" if verl_present else "n/a (verl not installed)"
    return [
        "",
        "goals (issue 2): literal/deltattg >= 20, deltattg/verl-grpo <= 1.0",
        f"same ratios on process-CPU medians: {cpu_ratios}",
        f"literal-core/deltattg speedup: {wall[LITERAL_CORE] / wall[DELTATTG]:.1f} (the inner loop alone, lists prebuilt)",
        f"literal/deltattg speedup: {wall[LITERAL] / wall[DELTATTG]:.1f}",
        f"deltattg/verl-grpo time ratio: {verl_ratio}",
    ]


if __name__ == "__main__":
    main()
