"""What the actor sees at each step.

Two layouts, both built from the episode so far:
  * ``window`` (verl-agent's ALFWorld prompt): one user message with the task (the first observation), the last
    ``history_window`` actions and their observations, the current observation and the admissible actions; every step
    is a fresh prompt of bounded length;
  * ``chat``: the whole conversation (system, observation, action, observation, ...), admissible actions appended to
    the latest observation.
The trajectory record always keeps the full chat (``messages``), whichever layout the actor saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class PromptConfig:
    layout: Literal["window", "chat"] = "window"
    history_window: int = 2
    list_admissible: bool = True


def with_admissible(observation: str, admissible: Sequence[str] | None, config: PromptConfig) -> str:
    if not (config.list_admissible and admissible):
        return observation
    return f"{observation}\nAdmissible actions: {', '.join(admissible)}"


def window_prompt(
    system_prompt: str,
    first_observation: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    admissible: Sequence[str] | None,
    config: PromptConfig,
) -> list[dict]:
    """verl-agent style: task, the last k (action, observation) pairs, the current observation and admissible actions."""
    recent = list(history)[-config.history_window :] if config.history_window > 0 else []
    parts = [first_observation]
    if history:
        parts.append(f"You have taken {len(history)} step(s). The most recent {len(recent)}:")
        parts.extend(f"> {action}\n{result}" for action, result in recent)
        parts.append(f"Current observation: {with_admissible(observation, admissible, config)}")
    else:
        parts[0] = with_admissible(first_observation, admissible, config)
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": "\n".join(parts)}]


def chat_prompt(messages: Sequence[dict], admissible: Sequence[str] | None, config: PromptConfig) -> list[dict]:
    """The whole conversation, admissible actions appended to the latest observation."""
    out = [dict(m) for m in messages]
    out[-1]["content"] = with_admissible(out[-1]["content"], admissible, config)
    return out


def episode_prompt(episode: Any, config: PromptConfig) -> list[dict]:
    """The chat messages an actor reads at a running episode's current state (``rollout.engine.Episode``), in the
    configured layout."""
    if config.layout == "chat":
        return chat_prompt(episode.messages, episode.admissible, config)
    return window_prompt(episode.env.system_prompt, episode.first_observation, episode.history, episode.observation,
                         episode.admissible, config)  # fmt: skip
