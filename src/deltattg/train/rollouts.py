"""What one training step learns from: tasks from a seeded, checkpointable sampler, G rollouts per task with the
rollout engine (Algorithm 1, lines 4–5) and, for DAPO, dynamic sampling (Appendix B)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.rollout.engine import Policy, run_episodes
from deltattg.train.config import AlgoConfig, EnvConfig, RolloutConfig

BUILT_IN_ENVS = ("household", "alfworld", "bfcl")


def env_factory(config: EnvConfig, max_turns: int) -> Callable[[], Environment]:
    """A constructor of fresh environment instances (the rollout engine makes one per episode)."""
    from deltattg.envs.registry import env_factory as make

    limit = {} if config.name == "household" else {"max_steps": max_turns}
    return make(config.name, data=config.data_dir, size=config.size, **limit, **config.options)


class TaskSampler:
    """Tasks in a fresh permutation each epoch, drawn from ``(seed, epoch)`` alone; (epoch, index) is all its state."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        if not tasks:
            raise ValueError("no tasks to sample from")
        self.tasks = list(tasks)
        self.seed = seed
        self.epoch = 0
        self.index = 0

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.tasks))

    def sample(self, n: int) -> list[Task]:
        out = []
        order = self._order()
        for _ in range(n):
            if self.index == len(self.tasks):
                self.epoch, self.index = self.epoch + 1, 0
                order = self._order()
            out.append(self.tasks[order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def group_reward_std(reward: Tensor, group: Tensor) -> Tensor:
    """Population standard deviation of the rewards of each group id 0..K−1 (as DAPO's filter computes it)."""
    count = torch.bincount(group).to(reward.dtype).clamp(min=1)
    mean = torch.bincount(group, weights=reward) / count
    return (torch.bincount(group, weights=(reward - mean[group]).square()) / count).sqrt()


def informative_groups(reward: Tensor, group: Tensor, min_std: float) -> Tensor:
    """DAPO's dynamic-sampling filter: True for the groups (ids 0..K−1) whose reward std is at least ``min_std``."""
    return group_reward_std(reward.double(), group) >= min_std


@dataclass
class RolloutBatch:
    """The groups a step trains on (G trajectories each, consecutive) and what generating them cost."""

    trajectories: list[Trajectory]
    group_size: int
    generated: list[Trajectory]  # every trajectory generated this step, dropped DAPO groups included
    gen_batches: int

    @property
    def group(self) -> list[int]:
        """Dense group id of each trajectory (a task sampled twice makes two groups, as verl's uid does)."""
        return [k // self.group_size for k in range(len(self.trajectories))]

    @property
    def generated_tokens(self) -> int:
        return sum(sum(t.step_tokens or []) for t in self.generated)


class DynamicSamplingExhausted(RuntimeError):
    """DAPO's dynamic sampling spent ``algo.max_gen_batches`` without keeping a single group."""


def collect(
    policy: Policy,
    make_env: Callable[[], Environment],
    sampler: TaskSampler,
    rollout: RolloutConfig,
    algo: AlgoConfig,
) -> RolloutBatch:
    """``batch_size`` tasks × G rollouts; with dynamic sampling, keep only groups with reward variance and generate
    further batches of ``batch_size`` tasks until ``batch_size`` groups are kept or ``max_gen_batches`` were generated
    (then train on the groups kept so far; none kept raises ``DynamicSamplingExhausted``)."""
    kept: list[list[Trajectory]] = []
    generated: list[Trajectory] = []
    gen_batches = 0
    while True:
        tasks = sampler.sample(rollout.batch_size)
        trajectories = run_episodes(make_env, tasks, policy, group_size=rollout.group_size, max_turns=rollout.max_turns)
        generated += trajectories
        gen_batches += 1
        groups = [trajectories[k : k + rollout.group_size] for k in range(0, len(trajectories), rollout.group_size)]
        if not algo.dynamic_sampling:
            kept = groups
            break
        reward = torch.tensor([t.reward for t in trajectories], dtype=torch.float64)
        group = torch.arange(len(trajectories)) // rollout.group_size
        keep = informative_groups(reward, group, algo.min_group_std)
        kept += [g for g, ok in zip(groups, keep.tolist()) if ok]
        if len(kept) >= rollout.batch_size or gen_batches >= algo.max_gen_batches:
            break
    if not kept:  # as verl's DAPO trainer: nothing to learn from is an error, not a silent empty step
        raise DynamicSamplingExhausted(
            f"dynamic sampling kept no group in algo.max_gen_batches={algo.max_gen_batches} generation batches: all "
            f"{len(generated) // rollout.group_size} groups had reward std < algo.min_group_std={algo.min_group_std} "
            "(every rollout of a task won, or every one lost); raise algo.max_gen_batches or change the tasks"
        )
    chosen = [t for g in kept[: rollout.batch_size] for t in g]
    return RolloutBatch(chosen, rollout.group_size, generated, gen_batches)
