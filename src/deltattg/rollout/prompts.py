"""What the actor sees at each step.

Two layouts, both built from the episode so far:
  * ``window`` (verl-agent's ALFWorld prompt): one user message with the task (the first observation), the last
    ``history_window`` actions and their observations, the current observation and the admissible actions; every step
    is a fresh prompt of bounded length;
  * ``chat``: the whole conversation (system, observation, action, observation, ...), admissible actions appended to
    the latest observation.
The trajectory record always keeps the full chat (``messages``), whichever layout the actor saw.

``react=True`` (the ReAct baseline, ``react:MODEL``) appends ``REACT_INSTRUCTION`` to the system prompt in both
layouts: the actor replies "Thought: ... Action: ...", and ``parse_react_action`` cuts out what the environment runs.
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
    react: bool = False  # ask for "Thought: ... Action: ..." (REACT_INSTRUCTION appended to the system prompt)


REACT_INSTRUCTION = ("Answer in this format: first \"Thought:\" and a short reasoning about what to do next, then "
                     "\"Action:\" and the single action to take. Only the action is executed.")
ACTION_MARKER = "Action:"


def parse_react_action(reply: str) -> str:
    """What the environment runs of a ReAct reply: the text after its last ``Action:`` (case-sensitive), stripped;
    a reply without one is sent whole, stripped (a model that skips the format still acts)."""
    head, marker, tail = reply.rpartition(ACTION_MARKER)
    return tail.strip() if marker else reply.strip()


def system_text(system_prompt: str, config: PromptConfig) -> str:
    return f"{system_prompt}\n\n{REACT_INSTRUCTION}" if config.react else system_prompt


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
    system = system_text(system_prompt, config)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def chat_prompt(messages: Sequence[dict], admissible: Sequence[str] | None, config: PromptConfig) -> list[dict]:
    """The whole conversation, admissible actions appended to the latest observation."""
    out = [dict(m) for m in messages]
    out[-1]["content"] = with_admissible(out[-1]["content"], admissible, config)
    if config.react and out and out[0].get("role") == "system":
        out[0]["content"] = system_text(out[0]["content"], config)
    return out


def episode_prompt(episode: Any, config: PromptConfig) -> list[dict]:
    """The chat messages an actor reads at a running episode's current state (``rollout.engine.Episode``), in the
    configured layout. Both read the recorded chat: its system message (with any Reflexion memory) and the replies
    as generated (a ReAct thought included), not only the commands the environment ran."""
    if config.layout == "chat":
        return chat_prompt(episode.messages, episode.admissible, config)
    messages = episode.messages
    history = [(reply["content"], result["content"]) for reply, result in zip(messages[2::2], messages[3::2])]
    return window_prompt(messages[0]["content"], episode.first_observation, history, episode.observation,
                         episode.admissible, config)  # fmt: skip
