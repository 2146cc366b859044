"""``deltattg collect``: trajectories of a pool of diverse policies (paper §3.1, D.1), in the core JSONL format.

Policy specs: ``expert`` (the environment's planner / walkthrough / ground truth), ``expert:EPS`` (with probability
EPS a mistake instead: a random admissible action, or on BFCL / τ² a wrong argument, the wrong tool or an early stop), ``random``, ``lm:MODEL`` (an HF causal LM: id, path or ``smollm2``),
``vllm:MODEL`` (the same through a vLLM engine, extra ``[vllm]``, GPU), ``react:MODEL`` (the HF LM prompted for
"Thought: ... Action: ...": the environment runs only the action, the record keeps the whole reply) and, for
``deltattg evaluate`` only (``parse_policy(..., trials=True)``), ``reflexion:MODEL`` (``rollout.reflexion``: up to 3
trials per task, a self-reflection after each failed one).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment
from deltattg.rollout.engine import Policy, run_episodes
from deltattg.rollout.policies import LMPolicy, NoisyExpertPolicy, RandomPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig


@dataclass(frozen=True)
class PolicySpec:
    kind: str  # expert | random | lm | vllm | react | reflexion
    epsilon: float = 0.0
    model: str | None = None
    alias: str | None = None  # the trajectories' policy name instead of the spec (the regime's base actor: "actor")

    @property
    def is_model(self) -> bool:
        """A language model acts (sampling settings apply; loaded once, not one instance per episode)."""
        return self.kind in MODEL_KINDS

    @property
    def name(self) -> str:
        """What the trajectories' ids and ``policy`` say: the alias, else ``expert-epsE``, ``random`` or the spec."""
        if self.alias is not None:
            return self.alias
        if self.kind == "expert":
            return f"expert-eps{self.epsilon:g}"
        return f"{self.kind}:{self.model}" if self.is_model else self.kind

    @property
    def text(self) -> str:
        """The spec as :func:`parse_policy` reads it back (``expert:0.3``, ``random``, ``lm:MODEL``)."""
        if self.kind == "expert":
            return f"expert:{self.epsilon:g}"
        return f"{self.kind}:{self.model}" if self.is_model else self.kind

    def resolved(self) -> PolicySpec:
        """The same spec with a local model path (``hf.looks_local``; the folder of ``DIR::FILE.gguf``) made
        absolute and resolved, so that ``DIR``, ``DIR/``, ``./DIR``, its absolute path and a link to it name one
        actor; Hub ids, ``smollm2`` and the non-model policies are returned as they are."""
        from deltattg.hf import looks_local

        if self.model is None:
            return self
        folder, sep, gguf_file = self.model.partition("::")
        if not (sep or looks_local(folder)):
            return self
        return replace(self, model=str(Path(folder).expanduser().resolve()) + sep + gguf_file)


MODEL_KINDS = ("lm", "vllm", "react", "reflexion")


def parse_policy(spec: str, *, trials: bool = False) -> PolicySpec:
    """``expert``, ``expert:0.2``, ``random``, ``lm:MODEL``, ``vllm:MODEL``, ``react:MODEL`` and, where several
    trials per task are played (``trials=True``: ``deltattg evaluate``), ``reflexion:MODEL``; anything else raises
    ``ValueError``."""
    kind, _, arg = spec.partition(":")
    if kind == "expert":
        epsilon = float(arg) if arg else 0.0
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"policy {spec!r}: the noise level must be in [0, 1]")
        return PolicySpec("expert", epsilon)
    if kind == "random" and not arg:
        return PolicySpec("random")
    if kind == "reflexion" and arg and not trials:
        raise ValueError(f"policy {spec!r}: Reflexion plays several trials per task, only `deltattg evaluate` takes it "
                         "(use react:MODEL for its single-trial actor)")  # fmt: skip
    if kind in MODEL_KINDS and arg:
        return PolicySpec(kind, model=arg)
    more = ", react:MODEL or reflexion:MODEL" if trials else " or react:MODEL"
    raise ValueError(f"unknown policy {spec!r}: use expert, expert:EPS, random, lm:MODEL, vllm:MODEL{more}")


def build_policy(spec: PolicySpec, seed: int, sampling: SamplingConfig, prompt: PromptConfig = PromptConfig()) -> Policy:
    """The policy of ``spec``. ``react`` and ``reflexion``: an HF LM with ``prompt.react`` set (Reflexion's actor is
    ReAct; ``rollout.reflexion.Reflexion`` wraps it with the reflection step)."""
    if spec.kind == "expert":
        return NoisyExpertPolicy(spec.epsilon, seed=seed, name=spec.name)
    if spec.kind == "random":
        return RandomPolicy(seed=seed, name=spec.name)
    assert spec.model is not None
    if spec.kind == "vllm":
        from deltattg.rollout.vllm import VLLMPolicy

        return VLLMPolicy(spec.model, sampling, prompt, name=spec.name)
    from deltattg.hf import load_causal_lm, load_tokenizer

    if spec.kind in ("react", "reflexion"):
        prompt = replace(prompt, react=True)
    policy = LMPolicy(load_causal_lm(spec.model).eval(), load_tokenizer(spec.model), sampling, prompt, name=spec.name)
    if spec.kind == "reflexion":
        from deltattg.rollout.reflexion import Reflexion

        return Reflexion(policy)
    return policy


def check_episodes(episodes: int, tasks: Sequence) -> None:
    """Refuse (``ValueError``) more episodes than ``tasks`` has distinct tasks, where each task is played once
    (``evaluate``, ``guide``)."""
    distinct = len({task.id for task in tasks})
    if episodes > distinct:
        raise ValueError(f"--episodes {episodes}: the split has only {distinct} tasks (each is played once)")


def choose_tasks(tasks: Sequence, episodes: int, group_size: int, seed: int) -> list:
    """ceil(episodes / group_size) distinct tasks drawn without replacement; ``ValueError`` when the split has fewer
    (a task drawn twice would repeat its trajectories' ids: play it more often with a larger ``group_size``)."""
    count = math.ceil(episodes / group_size)
    distinct = list({task.id: task for task in tasks}.values())
    if count > len(distinct):
        raise ValueError(f"--episodes {episodes} in groups of {group_size} plays {count} tasks, but the split has only "
                         f"{len(distinct)}: lower --episodes, or raise --group-size to play each task more often")
    return random.Random(seed).sample(distinct, count)


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
