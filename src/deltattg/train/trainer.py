"""Actor training on one machine (CPU or one GPU): GRPO, DAPO and DeltaTTG with its ablations in ONE loop.

Each step is Algorithm 1 (Appendix D.6), with verl-agent's data layout (one row per step):

    rollouts (lines 4–5)  ->  A_i, step-expanded group statistics (line 6, Eq. 14)
    ->  frozen meter on the decision states of A_i ≠ 0 trajectories, one call (lines 9–10)
    ->  credit by the chosen estimator: Ã_{i,t} = A_i · w_{i,t} (lines 11–32, Eq. 7–11)
    ->  θ_old log-probs recomputed, π_ref log-probs, one PPO epoch over mini-batches (line 34, Eq. 15–18 + KL + entropy)

What a method adds beside these is a side pass, called at three points of the step and timed under its own phase
(``deltattg.train.side_passes``): the estimator's, which its registry record names (IGPO / A²TGPO's answer log-probs,
DelTA's hidden states, CrEST's self-teacher), and the on-policy meter refresh that ``meter.refresh_every`` asks for.

``train(config)`` runs it; ``train(config, resume=...)`` continues a killed run exactly where its checkpoint left it.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from deltattg.credit import Credit, Estimator, StepBatch, get_estimator
from deltattg.credit.batch import credit_shares
from deltattg.credit.crest import verified_metrics
from deltattg.credit.grpo import outcome_advantage
from deltattg.credit.layouts import meter_readings
from deltattg.credit.records import trajectory_batch
from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.loss import LossConfig, policy_loss
from deltattg.meter.loading import check_meter_turn_limit, load_meter, read_states
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig
from deltattg.train import config as config_io
from deltattg.train.actor import TINY, Reference, demonstrations, load_actor, torch_device
from deltattg.train.checkpoint import (
    ACTOR,
    Checkpoint,
    MetricsLog,
    check_belongs,
    check_fresh_folder,
    config_hash,
    discard_checkpoints_after,
    prune_checkpoints,
    read_checkpoint,
    read_run,
    run_lock,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    start_run,
)
from deltattg.train.config import OptimConfig, RolloutConfig, TrainConfig
from deltattg.train.rollouts import RolloutBatch, TaskSampler, collect, env_factory
from deltattg.train.rows import Row, chunks, collate, pad_responses, response_logprobs, rows_logprobs, step_rows
from deltattg.train.rows import rows_logprobs_and_hidden
from deltattg.train.side_passes import Setup, UpdateBatch, side_passes

# ---- the PPO update (Appendix D.5) -----------------------------------------------------------------------------------
def ppo_update(
    actor: Any,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[Row],
    advantages: Tensor,
    old_logprobs: Sequence[Tensor],
    ref_logprobs: Sequence[Tensor] | None,
    loss_config: LossConfig,
    optim: OptimConfig,
    temperature: float,
    pad_id: int,
    share_prompts: bool = True,
    *,
    per_token_advantages: Sequence[Tensor] | None = None,
    clip_scales: Tensor | None = None,
) -> dict[str, float]:
    """One epoch over the rows in mini-batches, one optimizer step each. Rows are shuffled prompt by prompt (the rows
    that share a prompt stay together, as verl keeps a group's rows together), so a micro-batch reads each distinct
    prompt once. A mini-batch's loss is the token-mean over all its response tokens (Eq. 18): micro-batches are
    weighted by their share of its tokens. Returns the token-weighted means of ``policy_loss``'s metrics (over the
    mini-batches read), the mean gradient norm (before clipping), the step count and ``stopped_early`` (1 when
    ``optim.target_kl`` ended the epoch: the first mini-batch whose approximate KL exceeds it takes no step).

    Every response token of row k gets ``advantages[k]``, unless ``per_token_advantages`` gives each row its own
    advantages (1-D, one per response token, like ``old_logprobs``; DelTA's A·ω), which are used instead.
    ``clip_scales`` (one per row; A²TGPO's turn clip factor c of the row's step) widens or narrows every token's clip
    range of row k to [1 − η_low·c_k, 1 + η_high·c_k] (``policy_loss(clip_scale=...)``); None: the fixed range."""
    device = next(actor.parameters()).device
    params = [p for p in actor.parameters() if p.requires_grad]
    totals: dict[str, float] = defaultdict(float)
    tokens_seen, grad_norms, stopped = 0, [], False
    actor.train()
    for mini in chunks(shuffled_by_prompt(rows), optim.mini_batch_size):
        mini_tokens = sum(len(rows[k].response) for k in mini)
        mini_kl = 0.0
        optimizer.zero_grad(set_to_none=True)
        for micro in chunks(mini, optim.micro_batch_size):
            batch = collate([rows[k] for k in micro], pad_id, device, share=share_prompts)
            width = batch.response_length
            logprobs, entropy = response_logprobs(actor, batch, temperature, entropy_grad=loss_config.entropy_coef > 0)
            old = pad_responses([old_logprobs[k] for k in micro], width).to(device)
            ref = None if ref_logprobs is None else pad_responses([ref_logprobs[k] for k in micro], width).to(device)
            if per_token_advantages is None:
                token_advantages = advantages[micro].to(device)[:, None] * batch.response_mask  # Ã_{i,t,k} = A_i w_{i,t}
            else:  # each token its own (DelTA: A_i ω_k), padded with 0 like the old log-probs
                token_advantages = pad_responses([per_token_advantages[k] for k in micro], width).to(device)
            clip_scale = None if clip_scales is None else clip_scales[micro].to(device)[:, None]  # A²TGPO's c per row
            loss, metrics = policy_loss(
                logprobs, old, token_advantages, batch.response_mask, loss_config, ref_logprobs=ref, entropy=entropy,
                clip_scale=clip_scale,
            )
            micro_tokens = sum(len(rows[k].response) for k in micro)
            (loss * (micro_tokens / mini_tokens)).backward()
            for key, value in metrics.items():
                totals[key] += value * micro_tokens
            tokens_seen += micro_tokens
            mini_kl += metrics["approx_kl"] * micro_tokens / mini_tokens
        if optim.target_kl is not None and mini_kl > optim.target_kl:
            optimizer.zero_grad(set_to_none=True)
            stopped = True
            break
        grad_norms.append(torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm).item())
        optimizer.step()
    out = {key: value / max(tokens_seen, 1) for key, value in totals.items()}
    out["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
    out["optimizer_steps"] = len(grad_norms)
    out["stopped_early"] = float(stopped)
    return out


def shuffled_by_prompt(rows: Sequence[Row]) -> list[int]:
    """Row indices in a random order of their distinct prompts, the rows of one prompt together (torch's RNG)."""
    by_prompt: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for k, row in enumerate(rows):
        by_prompt[tuple(row.prompt)].append(k)
    groups = list(by_prompt.values())
    return [k for g in torch.randperm(len(groups)).tolist() for k in groups[g]]


# ---- credit ------------------------------------------------------------------------------------------------------------
def concentration_metrics(credit: Credit, steps: StepBatch) -> dict[str, float]:
    """Means over the credited trajectories of the step, :func:`deltattg.credit.batch.credit_shares`: the largest
    step's share of a trajectory's credit and how much of it moved from GRPO's token shares."""
    largest, _, moved, credited = credit_shares(credit.step_advantages, steps.step_tokens)
    if not credited.any():
        return {}
    return {"spread/largest_share": float(largest[credited].mean()), "spread/moved": float(moved[credited].mean())}


def row_advantages(credit: Credit, rows: Sequence[Row]) -> Tensor:
    """Ã_{i,t} of the step each row holds (every response token of the row gets it, Eq. 11)."""
    return credit.step_advantages[[r.traj for r in rows], [r.step for r in rows]]


def row_clip_scales(credit: Credit, rows: Sequence[Row]) -> Tensor | None:
    """The clip factor c_{i,t} of the step each row holds (A²TGPO), or None when the estimator gives none."""
    if credit.clip_scale is None:
        return None
    return credit.clip_scale[[r.traj for r in rows], [r.step for r in rows]]


def clip_scale_metrics(clip_scales: Tensor | None) -> dict[str, float]:
    """``clip/scale_min``, ``_max``, ``_mean`` over the rows (steps), and ``clip/scaled_rows`` (c ≠ 1); {} without."""
    if clip_scales is None or clip_scales.numel() == 0:
        return {}
    return {"clip/scale_min": clip_scales.min().item(), "clip/scale_max": clip_scales.max().item(),
            "clip/scale_mean": clip_scales.float().mean().item(), "clip/scaled_rows": int((clip_scales != 1).sum())}


def read_meter(meter: Any, estimator: Estimator, trajectories: Sequence[Trajectory], advantage: Tensor,
               steps: StepBatch, method: str) -> dict[str, float]:  # fmt: skip
    """Algorithm 1, lines 9–10: the frozen meter reads the decision states of the A_i ≠ 0 trajectories in one call;
    sets ``steps.meter`` and returns ``meter/*`` (what was read). Refuses readings that lack the estimator's field."""
    readings, scoring = read_states(meter, trajectories, estimator.queried(advantage).tolist())
    if estimator.reading_problem(readings) is not None:
        raise ValueError(f"algo.method {method} reads {estimator.meter_field!r}, which this meter's readings lack")
    steps.meter = meter_readings(readings, steps.step_mask.shape[1])
    return {f"meter/{k}": v for k, v in vars(scoring).items()}


def credit_metrics(credit: Credit, steps: StepBatch, rows: Sequence[Row], advantages: Tensor,
                   clip_scales: Tensor | None) -> dict[str, float]:  # fmt: skip
    """The step's record of its credit: clip factors, verified outcomes, fallbacks, the estimator's own metrics, how
    concentrated it is, the rows and tokens the update reads, and the advantages' size."""
    return clip_scale_metrics(clip_scales) | verified_metrics(steps) | credit.fallback_counts() | credit.metrics | \
        concentration_metrics(credit, steps) | {
            "train/rows": len(rows),
            "train/response_tokens": sum(len(r.response) for r in rows),
            "advantage/nonzero_trajectories": int((credit.advantage != 0).sum()),
            "advantage/abs_mean": advantages.abs().mean().item(),
        }  # fmt: skip


# ---- evaluation and accounting -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def isolated_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Sample with a fixed seed without touching the training RNG streams (evaluation never changes training)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def evaluate(
    actor: Any,
    tokenizer: Any,
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    rollout: RolloutConfig,
    prompt: PromptConfig,
    modes: dict[str, float],
    seed: int,
) -> dict[str, float]:
    """Success rate and mean turns on held-out ``tasks``, one episode each, per decoding mode (name -> temperature)."""
    out = {}
    actor.eval()
    with isolated_rng(seed, next(actor.parameters()).device):
        for mode, temperature in modes.items():
            policy = LMPolicy(actor, tokenizer, sampling_config(rollout, temperature), prompt, name=f"eval-{mode}")
            trajectories = run_episodes(make_env, tasks, policy, max_turns=rollout.max_turns)
            out[f"eval/{mode}_success"] = mean([t.success for t in trajectories])
            out[f"eval/{mode}_turns"] = mean([t.num_steps for t in trajectories])
    return out


def mean(values: Sequence[float | bool]) -> float:
    return float(sum(values)) / len(values) if values else 0.0


def sampling_config(rollout: RolloutConfig, temperature: float, share_prompts: bool = True) -> SamplingConfig:
    return SamplingConfig(
        temperature=temperature,
        top_p=rollout.top_p,
        max_new_tokens=rollout.max_new_tokens,
        batch_size=rollout.generation_batch_size,
        max_prompt_tokens=rollout.max_prompt_tokens,
        share_prompts=share_prompts,
    )


def rollout_metrics(batch: RolloutBatch, dynamic_sampling: bool) -> dict[str, float]:
    generated, kept = batch.generated, batch.trajectories
    out = {
        "rollout/success": mean([t.success for t in generated]),
        "rollout/reward": mean([t.reward for t in generated]),
        "rollout/turns": mean([t.num_steps for t in generated]),
        "rollout/trajectories": len(generated),
        "rollout/response_tokens": batch.generated_tokens,
        "train/trajectories": len(kept),
        "train/success": mean([t.success for t in kept]),
    }
    if dynamic_sampling:
        out["dapo/gen_batches"] = batch.gen_batches
        out["dapo/kept_groups"] = len(kept) // batch.group_size
    return out


PHASES = ("rollout", "meter", "answer", "credit", "teacher", "update")  # answer: IGPO / A²TGPO's answer log-probs;
# teacher: CrEST's privileged self-teacher pass


class PhaseTimer:
    """Wall time per phase of a step (CUDA work is waited for, so the split is honest)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in PHASES:  # a side pass's phase outside PHASES would vanish from the time/* split
            raise ValueError(f"unknown phase {phase!r}; the phases are {', '.join(PHASES)}")
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """``time/<phase>``, ``time/step`` and the meter's share of the step (§4.4 counts meter inference)."""
        total = sum(self.seconds.values())
        out = {f"time/{phase}": self.seconds.get(phase, 0.0) for phase in PHASES}
        return out | {"time/step": total, "meter_share": self.seconds.get("meter", 0.0) / total if total else 0.0}


# ---- the loop ----------------------------------------------------------------------------------------------------------
def resolve_checkpoint(out: Path, resume: str | Path | None, overwrite: bool = False) -> Checkpoint | None:
    """``None``: a fresh run (refused in a folder that holds a run, unless ``overwrite``); ``"latest"``: the run's
    newest checkpoint (fresh when there is none); ``"latest-valid"``: the newest one that loads; else a checkpoint
    folder of this run. The checkpoint is read and checked (weights-only, intact, this run's) before anything is
    written."""
    if resume is None:
        check_fresh_folder(out, overwrite)
        return None
    if overwrite:
        raise ValueError("--overwrite starts the run over: it cannot be combined with --resume")
    checkpoint = read_checkpoint(out, resume)
    if checkpoint is not None:
        check_belongs(checkpoint, out)
    return checkpoint


def train(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    overwrite: bool = False,
    make_env: Callable[[], Environment] | None = None,
) -> list[dict]:
    """Train the actor as ``config`` says; write ``run.json``, ``config.yaml``, ``metrics.jsonl`` and checkpoints under
    ``config.run.out``. ``resume``: ``"latest"``, ``"latest-valid"`` or a checkpoint folder of this run. A fresh run
    refuses a folder that already holds a run unless ``overwrite`` (which deletes that run's files first).
    ``make_env``: a constructor of your own environment instances (any ``envs.base.Environment``) instead of
    ``config.env``'s built-in one; its tasks are still chosen by ``config.env``'s splits. Returns every metrics
    record. While it runs, the folder is locked against every other process (:func:`~deltattg.train.checkpoint.run_lock`)."""
    with run_lock(Path(config.run.out)):
        return train_in_locked_folder(config, resume=resume, overwrite=overwrite, make_env=make_env)


def train_in_locked_folder(
    config: TrainConfig,
    *,
    resume: str | Path | None,
    overwrite: bool,
    make_env: Callable[[], Environment] | None,
) -> list[dict]:
    """:func:`train`'s body, run while its process holds the run folder's lock."""
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    out = Path(config.run.out)
    checkpoint = resolve_checkpoint(out, resume, overwrite)  # nothing but the lock is written before this check
    identity = read_run(out) if resume is not None else None  # a resumed run keeps its identity; a fresh one gets one
    config_text = config_io.dump(config)
    rollout, algo, loss_config = config.rollout, config.algo, config.loss

    # ---- setup: environment, actor, π_ref, frozen meter, side passes, optimizer, task sampler ----
    make_env = make_env or env_factory(config.env, rollout.max_turns)
    env = make_env()
    prompt = PromptConfig(layout=rollout.prompt_layout, history_window=rollout.history_window)  # type: ignore[arg-type]
    seed = config.run.seed
    actor, tokenizer = load_actor(
        config.actor, env, prompt, rollout.max_turns, seed, checkpoint.path / ACTOR if checkpoint else None
    )
    device = torch_device(config.actor.device)
    share = config.run.share_prompts
    policy = LMPolicy(actor, tokenizer, sampling_config(rollout, rollout.temperature, share), prompt, name="actor")
    if config.actor.model == TINY:  # a word-level tokenizer must know every word the actor will read or write
        demonstrations(policy, make_env, env.tasks(config.env.train_split)[:2], rollout.max_turns)
    reference = None
    if loss_config.kl_coef > 0:
        reference = Reference.build(actor, config.actor, env, prompt, rollout.max_turns, seed)
    estimator = get_estimator(algo.estimator)
    meter = None
    if estimator.needs_meter:
        meter = load_meter(config.meter.path, device=device, readout=estimator.readout,  # type: ignore[arg-type]
                           tokenizer=tokenizer, oracle=config.meter.oracle())  # fmt: skip
        check_meter_turn_limit(meter, rollout.max_turns, f"meter.path {config.meter.path}", "rollout.max_turns")
    # The estimator's side pass (IGPO / A²TGPO's answer log-probs, DelTA's hidden states, CrEST's self-teacher) and
    # the on-policy meter refresh (meter.refresh_every): deltattg.train.side_passes.
    side = side_passes(Setup(config, estimator, policy, env, env.tasks(config.env.train_split), meter, make_env))
    optimizer = torch.optim.AdamW(
        [p for p in actor.parameters() if p.requires_grad], lr=config.optim.lr, weight_decay=config.optim.weight_decay
    )
    sampler = TaskSampler(env.tasks(config.env.train_split), seed)
    eval_tasks = list(env.tasks(config.env.eval_split))[: config.eval.num_tasks or None]
    test_tasks = list(env.tasks(config.eval.test_split))[: config.eval.test_tasks or None] if config.eval.test_split \
        else []  # fmt: skip
    eval_modes = {
        mode: t for mode, t in (("greedy", 0.0), ("sampled", rollout.temperature)) if getattr(config.eval, mode)
    }
    pad_id = tokenizer.pad_token_id

    run = start_run(out, config_text, overwrite=overwrite, run=identity)  # the setup worked: now the folder is written
    start, generated_tokens, records = 0, 0, []  # generated_tokens: cumulative actor response tokens (Fig. 3 b)
    if checkpoint is None:
        seed_everything(seed)
    else:
        saved = checkpoint.state
        optimizer.load_state_dict(checkpoint.optimizer)
        sampler.load_state_dict(saved["sampler"])
        start, generated_tokens, records = saved["step"], saved["generated_tokens"], saved["metrics"]
        side.load_state_dict(saved)  # e.g. the meter as the run had refreshed it
        discard_checkpoints_after(out, start)
        set_rng_state(saved["rng"])  # last: loading models may draw random numbers
    log = MetricsLog(out, records, config.run.tensorboard)

    def evaluation(step: int) -> dict[str, float]:
        return evaluate(actor, tokenizer, make_env, eval_tasks, rollout, prompt, eval_modes, seed + step)

    if start == 0 and config.eval.at_start and config.eval.every:
        log.write({"step": 0, "cumulative_response_tokens": 0} | evaluation(0))

    bar = tqdm(range(start + 1, config.run.steps + 1), initial=start, total=config.run.steps, desc="train",
               unit="step", disable=not config.run.progress)  # fmt: skip
    for step in bar:
        timer = PhaseTimer(device)
        record: dict[str, Any] = {"step": step}

        # Lines 4–5: sample tasks; G trajectories each with π_θold; terminal rewards R_i (DAPO: dynamic sampling).
        with timer("rollout"):
            actor.eval()
            batch = collect(policy, make_env, sampler, rollout, algo)
        trajectories = batch.trajectories
        generated_tokens += batch.generated_tokens
        record |= rollout_metrics(batch, algo.dynamic_sampling) | {"cumulative_response_tokens": generated_tokens}
        record |= side.before_credit(trajectories, timer)  # IGPO / A²TGPO: the answer's log-probs after every turn

        with timer("credit"):  # line 6: A_i (Eq. 14)
            steps = trajectory_batch(trajectories, [t.step_tokens for t in trajectories], estimator, batch.group,
                                     with_meter=False)  # fmt: skip
            advantage = outcome_advantage(steps, config.credit)
        if meter is not None:  # lines 9–10: the frozen meter on the decision states of the A_i ≠ 0 trajectories
            with timer("meter"):
                record |= read_meter(meter, estimator, trajectories, advantage, steps, algo.method)
        with timer("credit"):  # lines 11–32: Ã_{i,t} = A_i · w_{i,t} (Eq. 7–11; GRPO/DAPO: w = 1), one row per step
            credit = estimator(steps, config.credit)
            rows = step_rows(trajectories)
            advantages = row_advantages(credit, rows)
            clip_scales = row_clip_scales(credit, rows)  # A²TGPO's per-step clip factors; None for the others
        record |= side.after_credit(step, trajectories, timer)  # the meter refresh, once this step's credit was read
        record |= credit_metrics(credit, steps, rows, advantages, clip_scales)

        # Line 34: θ_old's log-probs (the sampler's, or recomputed as verl does), the side passes' per-token advantages
        # (DelTA's A·ω, CrEST's Ã·w), π_ref's log-probs, then one PPO epoch (Eq. 15–18, KL, entropy).
        with timer("update"):
            actor.eval()
            update = update_batch(actor, trajectories, rows, advantages, pad_id, rollout.temperature, config.optim,
                                  share, hidden=side.reads_hidden_states)  # fmt: skip
            if config.optim.recompute_old_logprobs:
                record["rollout_logprob_gap"] = logprob_gap(update.old_logprobs, trajectories, rows)
        record |= side.token_advantages(update, timer)
        with timer("update"):
            ref = None
            if reference is not None:
                ref = reference.logprobs(rows, pad_id, rollout.temperature, config.optim.micro_batch_size, share)
            record |= ppo_update(actor, optimizer, rows, advantages, update.old_logprobs, ref, loss_config,
                                 config.optim, rollout.temperature, pad_id, share,
                                 per_token_advantages=update.per_token, clip_scales=clip_scales)  # fmt: skip

        record |= timer.metrics()
        if config.eval.every and step % config.eval.every == 0:
            record |= evaluation(step)
        if test_tasks and step == config.run.steps:  # the report's split, once, at the end
            test = evaluate(actor, tokenizer, make_env, test_tasks, rollout, prompt, {"greedy": 0.0}, seed + step)
            record |= {key.replace("eval/", "test/"): value for key, value in test.items()}
        log.write(record)
        bar.set_postfix(success=f"{record['rollout/success']:.2f}", loss=f"{record.get('loss', 0.0):.3f}",
                        s=f"{record['time/step']:.1f}")  # fmt: skip
        if config.run.save_every and (step % config.run.save_every == 0 or step == config.run.steps):
            state = {
                "step": step,
                "generated_tokens": generated_tokens,
                "metrics": log.records,
                "sampler": sampler.state_dict(),
                "run_id": run["run_id"],
                "config_sha256": config_hash(config_text),
            }
            save_checkpoint(out, step, actor, tokenizer, optimizer, state | side.state_dict())
            prune_checkpoints(out, config.run.keep_checkpoints)
    log.close()
    return log.records


def update_batch(
    actor: Any,
    trajectories: Sequence[Trajectory],
    rows: Sequence[Row],
    advantages: Tensor,
    pad_id: int,
    temperature: float,
    optim: OptimConfig,
    share: bool,
    *,
    hidden: bool,
) -> UpdateBatch:
    """The rows with θ_old's log-probs: the sampler's, or recomputed by a no-grad pass as verl does
    (``optim.recompute_old_logprobs``). That pass also runs, keeping each row's last hidden states, when a side pass
    reads them (``hidden``: DelTA), whether or not its log-probs become θ_old's."""
    recomputed, states = None, None
    if hidden:
        recomputed, states = rows_logprobs_and_hidden(actor, rows, pad_id, temperature, optim.micro_batch_size,
                                                      share=share)  # fmt: skip
    elif optim.recompute_old_logprobs:
        recomputed = rows_logprobs(actor, rows, pad_id, temperature, optim.micro_batch_size, share=share)
    old = sampled_logprobs(trajectories, rows) if recomputed is None or not optim.recompute_old_logprobs else recomputed
    return UpdateBatch(trajectories, rows, advantages, old, recomputed, states)


def sampled_logprobs(trajectories: Sequence[Trajectory], rows: Sequence[Row]) -> list[Tensor]:
    """Each row's response log-probs as the rollout recorded them (θ_old's: the actor sampled with those weights)."""
    return [torch.tensor(trajectories[r.traj].steps[r.step].logprobs) for r in rows]  # type: ignore[index,arg-type]


def logprob_gap(old: Sequence[Tensor], trajectories: Sequence[Trajectory], rows: Sequence[Row]) -> float:
    """Mean |recomputed − sampled| log-prob per token: ~0 unless generation and training forward passes disagree."""
    gaps = [
        (o - torch.tensor(trajectories[r.traj].steps[r.step].logprobs)).abs()  # type: ignore[index]
        for o, r in zip(old, rows)
        if trajectories[r.traj].steps[r.step].logprobs is not None  # type: ignore[index]
    ]
    return torch.cat(gaps).mean().item() if gaps else 0.0

