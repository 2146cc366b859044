"""``deltattg collect``: trajectories of a pool of diverse policies (paper §3.1, D.1), in the core JSONL format.

Policy specs: ``expert`` (the environment's planner / walkthrough / ground truth), ``expert:EPS`` (with probability
EPS a random admissible action instead), ``random``, ``lm:MODEL`` (an HF causal LM: id, path or ``smollm2``),
``vllm:MODEL`` (the same through a vLLM engine, extra ``[vllm]``, GPU).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment
from deltattg.rollout.engine import Policy, run_episodes
from deltattg.rollout.policies import LMPolicy, NoisyExpertPolicy, RandomPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig


@dataclass(frozen=True)
class PolicySpec:
    kind: str  # expert | random | lm | vllm
    epsilon: float = 0.0
    model: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "expert":
            return f"expert-eps{self.epsilon:g}"
        return f"{self.kind}:{self.model}" if self.kind in ("lm", "vllm") else self.kind


def parse_policy(spec: str) -> PolicySpec:
    """``expert``, ``expert:0.2``, ``random`` or ``lm:MODEL``; anything else raises ``ValueError``."""
    kind, _, arg = spec.partition(":")
    if kind == "expert":
        epsilon = float(arg) if arg else 0.0
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"policy {spec!r}: the noise level must be in [0, 1]")
        return PolicySpec("expert", epsilon)
    if kind == "random" and not arg:
        return PolicySpec("random")
    if kind in ("lm", "vllm") and arg:
        return PolicySpec(kind, model=arg)
    raise ValueError(f"unknown policy {spec!r}: use expert, expert:EPS, random, lm:MODEL or vllm:MODEL")


def build_policy(spec: PolicySpec, seed: int, sampling: SamplingConfig, prompt: PromptConfig = PromptConfig()) -> Policy:
    if spec.kind == "expert":
        return NoisyExpertPolicy(spec.epsilon, seed=seed, name=spec.name)
    if spec.kind == "random":
        return RandomPolicy(seed=seed, name=spec.name)
    assert spec.model is not None
    if spec.kind == "vllm":
        from deltattg.rollout.vllm import VLLMPolicy

        return VLLMPolicy(spec.model, sampling, prompt, name=spec.name)
    from deltattg.hf import load_causal_lm, load_tokenizer

    return LMPolicy(load_causal_lm(spec.model).eval(), load_tokenizer(spec.model), sampling, prompt, name=spec.name)


def choose_tasks(tasks: Sequence, episodes: int, group_size: int, seed: int) -> list:
    """ceil(episodes / group_size) tasks drawn without replacement (with replacement if the split is smaller)."""
    count = math.ceil(episodes / group_size)
    rng = random.Random(seed)
    if count <= len(tasks):
        return rng.sample(list(tasks), count)
    return [rng.choice(list(tasks)) for _ in range(count)]


def collect(
    make_env: Callable[[], Environment],
    split: str,
    specs: Sequence[PolicySpec],
    *,
    episodes: int,
    group_size: int = 1,
    seed: int = 0,
    sampling: SamplingConfig = SamplingConfig(),
    max_turns: int | None = None,
    prompt: PromptConfig | None = None,
    progress: bool = True,
) -> list[Trajectory]:
    """``episodes`` trajectories per policy on the same tasks, pooled; ids are ``POLICY/TASK#k``. ``prompt``: what
    LM policies see (default: the environment's layout with the default history window)."""
    import torch

    probe = make_env()
    tasks = choose_tasks(probe.tasks(split), episodes, group_size, seed)
    prompt = prompt or PromptConfig(layout=getattr(probe, "prompt_layout", "window"))
    pooled: list[Trajectory] = []
    for k, spec in enumerate(specs):
        torch.manual_seed(seed + k)
        policy = build_policy(spec, seed + k, sampling, prompt)
        runs = run_episodes(make_env, tasks, policy, group_size=group_size, max_turns=max_turns,
                            run=f"{spec.name}/", progress=progress)
        pooled += runs[:episodes]
    return pooled
