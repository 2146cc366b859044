"""A verl agent loop that plays any deltattg environment (household, ALFWorld, BFCL, τ²-bench) with verl's served actor.

One ``AgentLoopOutput`` per step (verl's v1 multi-output path): step t's row holds the prompt the actor read at
state h_t (the window or chat layout of ``deltattg train``) and the action tokens it sampled, all trainable
(response mask 1). Every row's ``extra_fields`` carries ``deltattg_step`` = t and ``deltattg_tokens`` (the action's
token count, which lets the trainer tell the rows apart); the last row carries the episode's
trajectory record (messages, per-step observations, rewards and verified outcomes, the task's provenance), which is
what the meter reads and what the credit step (:mod:`deltattg.verl.credit`) lines the rows up with. The reward is the
environment's outcome, set here, so verl's reward loop does not score these rows.

Dataset rows (``deltattg verl-tasks``, :mod:`deltattg.verl.tasks`) name the task in ``extra_info.deltattg_task``:
the environment's description (``describe()``) and the task's id, split and data. Selected per row by ``agent_name: deltattg_env`` or for the
whole run by ``actor_rollout_ref.rollout.agent.default_agent_loop=deltattg_env``; options (``history_window``,
``layout``, ``list_admissible``, ``max_turns``, ``max_tokens``) come from the agent-loop YAML entry; without a
``max_turns`` there, an episode stops after verl's ``actor_rollout_ref.rollout.multi_turn.max_assistant_turns``
(what ``recipes/verl/train.sh`` sets), and never later than the environment's step limit.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from deltattg.rollout.engine import Action, advance, start_episode, to_trajectory
from deltattg.rollout.prompts import PromptConfig, episode_prompt
from deltattg.verl.credit import STEP_FIELD, TOKENS_FIELD, TRAJECTORY_FIELD
from deltattg.verl.tasks import AGENT_NAME, rebuild_task

@register(AGENT_NAME)
class EnvAgentLoop(AgentLoopBase):
    """Plays one episode of a deltattg environment; returns one output per step (see the module docstring)."""

    def __init__(self, *args: Any, history_window: int = 2, layout: str = "window", list_admissible: bool = True,
                 max_turns: int | None = None, max_tokens: int | None = None, **kwargs: Any):  # fmt: skip
        super().__init__(*args, **kwargs)
        self.prompt = PromptConfig(layout=layout, history_window=history_window, list_admissible=list_admissible)  # type: ignore[arg-type]
        self.max_turns = max_turns or getattr(self.rollout_config.multi_turn, "max_assistant_turns", None)
        self.max_tokens = min(int(self.rollout_config.response_length), max_tokens or 1 << 30)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        env, task = rebuild_task(kwargs.get("extra_info"))
        episode = start_episode(env, task, int(kwargs.get("session_id", 0)))
        turns = min(self.max_turns or env.max_steps, env.max_steps)
        params = {**sampling_params, "max_tokens": self.max_tokens}
        request_id = uuid4().hex  # one id for the episode: sticky session, prefix caching across turns
        outputs: list[AgentLoopOutput] = []
        while not episode.done and len(episode.steps) < turns:
            # verl's builder left-truncates a prompt longer than rollout.prompt_length (with a warning)
            prompt_ids = await self.ct_build_initial_tokens(episode_prompt(episode, self.prompt))
            out = await self.server_manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
            ids = list(out.token_ids)[: self.max_tokens]
            text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
            advance(episode, Action(text))
            outputs.append(AgentLoopOutput(
                prompt_ids=prompt_ids,
                response_ids=ids,
                response_mask=[1] * len(ids),
                response_logprobs=list(out.log_probs)[: len(ids)] if out.log_probs else None,
                num_turns=2,
                metrics={},
                extra_fields={**(out.extra_fields or {}), STEP_FIELD: len(outputs), TOKENS_FIELD: len(ids)},
            ))  # fmt: skip
        record = to_trajectory(episode, "verl", "", turns).to_json()
        for output in outputs:
            output.reward_score = episode.reward
        outputs[-1].extra_fields |= {TRAJECTORY_FIELD: record, "reward_extra_info": {"success": float(episode.won)}}
        if any(o.response_logprobs is None for o in outputs):  # every output of a session sets the same fields
            for output in outputs:
                output.response_logprobs = None
        return outputs
