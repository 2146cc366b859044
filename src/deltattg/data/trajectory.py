"""The trajectory record: one agent episode, as JSONL and as a Python object.

One JSON object per line::

    {"id": "t0", "group": "task-17", "reward": 1.0, "success": true, "policy": "qwen3-4b",
     "messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}, {"role": "tool", ...}],
     "step_tokens": [12, 40],                      # optional: assistant tokens of each action
     "steps": [{"observation": "...", "token_ids": [...], "logprobs": [...], "reward": 0.0,
                "verified": true, "command": "...", "error": "..."}],                          # optional (rollouts)
     "meter": [{"can_complete": true, "tokens_to_go": 412}, null],                        # optional (scored)
     "answer_logprobs": [-2.3, -1.9, -0.4]}                    # optional (IGPO / A²TGPO): T + 1 numbers <= 0

A *step* (action) is one assistant message; step t's decision prefix is every message before it. ``T`` is the number
of steps. ``answer_logprobs[t]`` (t = 0..T) is the mean token log-probability of the task's reference answer,
teacher-forced after the first t steps (t = 0: the prompt alone), which IGPO and A²TGPO read. ``steps[t].verified``
is the step's outcome as the environment itself verified it (true: the action was admissible / its tool calls ran
without error; false: they were not; absent or null: nothing to verify), which CrEST reads; ``steps[t].command`` is
what the environment executed where that is not the whole reply (a ReAct reply's action), which a replay repeats
(``rollout.replay``); ``steps[t].error`` says why the environment could not carry the step out (a retrieval server
that did not answer, a scenario server that died, a verifier that failed), absent when it could. Fields we do not know are kept and written
back unchanged.

Numbers are bounded so that no computation downstream overflows: a step's token count (``step_tokens``, the length
of ``token_ids``) is at most ``MAX_STEP_TOKENS`` = 10^9, a token id below 2^31, ``tokens_to_go`` at most
``MAX_TOKENS_TO_GO`` = 10^12, and rewards, logits, scores and log-probabilities at most ``MAX_MAGNITUDE`` = 10^9 in
absolute value; everything must be finite.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deltattg.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
MAX_STEP_TOKENS = 10**9  # tokens of one action
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKENS_TO_GO = 1e12  # a meter's Token-to-Go reading
MAX_MAGNITUDE = 1e9  # |reward|, |logit|, |score|, |logprob|


@dataclass(frozen=True)
class MeterOutput:
    """One progress-meter reading of a decision prefix (an invalid reading is ``None``, never a MeterOutput).

    ``can_complete`` / ``tokens_to_go`` are the paper's (b̂, v̂) (§3.1; the paper's credit reads v̂ only where b̂ is
    true; a regression meter also gives it where b̂ is false — the remaining work *if* the task completes — which the
    soft readout reads); ``logit`` is log p(true) − log p(false) after ``{"can_complete":`` (E.4, +logit);
    ``score`` is a final-score estimate S_φ(h) (E.4, +value); ``probability`` is the meter's calibrated completion
    probability p̃ (its logit over the temperature fitted on held-out states; the robust credit's soft readout).
    """

    can_complete: bool | None = None
    tokens_to_go: float | None = None
    logit: float | None = None
    score: float | None = None
    probability: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.can_complete is not None:
            out["can_complete"] = self.can_complete
            out["tokens_to_go"] = _plain_number(self.tokens_to_go)
        if self.logit is not None:
            out["logit"] = self.logit
        if self.score is not None:
            out["score"] = self.score
        if self.probability is not None:
            out["probability"] = self.probability
        return out


def calibrated_probability(logit: float, temperature: float) -> float:
    """p̃ = σ(logit / temperature) (temperature scaling, Guo et al. 2017), computed without overflow."""
    z = logit / temperature
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass
class Step:
    """Rollout detail of one action: what the loss and the observation-grouping estimators need."""

    observation: str | None = None  # the observation the action was taken in (the state GiGPO-style methods group by)
    token_ids: list[int] | None = None  # the assistant tokens the actor generated
    logprobs: list[float] | None = None  # their log-probabilities under the sampling policy
    prompt_ids: list[int] | None = None  # the exact prompt the actor saw, to recompute log-probs in the update
    reward: float = 0.0
    verified: bool | None = None  # the environment verified the step's outcome (True/False); None: nothing verified
    command: str | None = None  # what the environment executed, where not the whole reply (ReAct: the Action part)
    error: str | None = None  # why the environment could not carry the step out (its service failed); None: it could

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Trajectory:
    id: str
    group: str
    reward: float
    success: bool
    messages: list[dict] | None = None
    step_tokens: list[int] | None = None
    policy: str | None = None
    steps: list[Step] | None = None
    meter: list[MeterOutput | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    answer_logprobs: list[float] | None = None  # T + 1 mean token log-probs of the reference answer (IGPO, A²TGPO)

    @property
    def num_steps(self) -> int:
        if self.step_tokens is not None:
            return len(self.step_tokens)
        if self.messages is not None:
            return len(assistant_indices(self.messages))
        if self.steps is not None:
            return len(self.steps)
        raise InputError("has neither messages, step_tokens nor steps", field="messages")

    def prefixes(self, terminal: bool = False) -> Iterator[list[dict]]:
        """Decision prefixes h_t (all messages before assistant message t), t = 0..T-1, and h_T when ``terminal``."""
        if self.messages is None:
            raise InputError("decision prefixes need messages", field="messages")
        for index in assistant_indices(self.messages):
            yield self.messages[:index]
        if terminal:
            yield list(self.messages)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "group": self.group, "reward": self.reward, "success": self.success}
        if self.policy is not None:
            out["policy"] = self.policy
        if self.messages is not None:
            out["messages"] = self.messages
        if self.step_tokens is not None:
            out["step_tokens"] = self.step_tokens
        if self.steps is not None:
            out["steps"] = [step.to_json() for step in self.steps]
        if self.meter is not None:
            out["meter"] = [None if m is None else m.to_json() for m in self.meter]
        if self.answer_logprobs is not None:
            out["answer_logprobs"] = self.answer_logprobs
        out.update(self.extra)
        return out


KNOWN_FIELDS = {"id", "group", "reward", "success", "policy", "messages", "step_tokens", "steps", "meter",
                "answer_logprobs"}


def assistant_indices(messages: list[dict]) -> list[int]:
    """Positions of the assistant messages: the actions of the trajectory."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def state_prefixes(messages: list[dict], terminal: bool) -> list[list[dict]]:
    """The decision prefixes h_0..h_{T−1} (each ends before an action), and h_T with ``terminal``."""
    cuts = assistant_indices(messages) + ([len(messages)] if terminal else [])
    return [messages[:k] for k in cuts]


def action_texts(trajectory: Trajectory) -> list[str]:
    """The text of each action (assistant message), t = 0..T−1: a list of content parts joined (:func:`text_of`);
    empty when the record has no messages."""
    messages = trajectory.messages or []
    return [text_of(messages[index].get("content")) for index in assistant_indices(messages)]


def anchor_observations(trajectory: Trajectory) -> list[str]:
    """The anchor observation of each step (GiGPO's state key): the observation its action answered —
    ``steps[t].observation`` where the rollout recorded it, else the contents of the non-assistant messages between
    action t − 1 and action t (t = 0: every message before the first action), joined by newlines."""
    steps = trajectory.steps or []
    if steps and all(step.observation is not None for step in steps):
        return [str(step.observation) for step in steps]
    messages = trajectory.messages or []
    anchors, start = [], 0
    for index in assistant_indices(messages):
        anchors.append("\n".join(text_of(m.get("content")) for m in messages[start:index]))
        start = index + 1
    return anchors


def decision_state_keys(trajectory: Trajectory) -> list[str | None]:
    """An identity of each decision state h_0..h_{T−1} — a SHA-256 chained over the canonical JSON of the messages
    before the action, so two states have the same key exactly when their histories are equal (in any trajectory of
    the batch); ``None`` for every state of a record without messages."""
    messages = trajectory.messages
    if messages is None:
        return [None] * trajectory.num_steps
    keys, digest, start = [], hashlib.sha256(), 0
    for index in assistant_indices(messages):
        for message in messages[start:index]:
            digest.update(json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii"))
            digest.update(b"\n")
        keys.append(digest.copy().hexdigest())
        start = index
    return keys


def verified_outcomes(trajectory: Trajectory) -> list[bool | None]:
    """v_t of each step as the environment verified it (``steps[t].verified``: True, False, or None where nothing was
    verified); None on every step when the record has no ``steps``."""
    steps = trajectory.steps or []
    if len(steps) != trajectory.num_steps:
        return [None] * trajectory.num_steps
    return [step.verified for step in steps]


def text_of(content: Any) -> str:
    """Message content as text (OpenAI content may be ``None`` or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def step_rewards(trajectory: Trajectory) -> list[float]:
    """r_t of each step: ``steps[t].reward`` where the rollout recorded steps whose rewards add up to the episode's
    reward; otherwise 0 on every step but the last, which gets the reward R."""
    count = trajectory.num_steps
    steps = trajectory.steps or []
    recorded = [step.reward for step in steps]
    if len(steps) == count and math.isclose(sum(recorded), trajectory.reward, rel_tol=1e-6, abs_tol=1e-9):
        return recorded
    return [0.0] * (count - 1) + [trajectory.reward] if count else []


def _plain_number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def _require(record: dict, name: str) -> Any:
    if name not in record:
        raise InputError("missing required field", field=name)
    return record[name]


def _as_id(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"must be a string or an integer, got {type(value).__name__}", field=name)
    return str(value)


def _as_finite(value: Any, name: str, limit: float = MAX_MAGNITUDE) -> float:
    """A finite number of magnitude at most ``limit``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"must be a number, got {type(value).__name__}", field=name)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        raise InputError(f"must be finite, got {_short(value)}", field=name) from None
    if not math.isfinite(number):
        raise InputError(f"must be finite, got {value!r}", field=name)
    if abs(number) > limit:
        raise InputError(f"must be at most {limit:g} in magnitude, got {_short(value)}", field=name)
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


def _as_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {value!r}", field=name)
    return value


def _as_count(value: Any, name: str, limit: int = MAX_STEP_TOKENS) -> int:
    """A token count: a non-negative integer up to ``limit`` (``3.0`` is accepted as 3, ``2.5`` and ``-1`` are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"must be a non-negative integer, got {_short(value)}", field=name)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise InputError(f"must be a non-negative integer, got {value!r}", field=name)
    if value < 0:
        raise InputError(f"must be a non-negative integer, got {_short(value)}", field=name)
    if value > limit:
        raise InputError(f"must be at most {limit:,}, got {_short(value)}", field=name)
    return int(value)


def parse_messages(value: Any) -> list[dict]:
    if not isinstance(value, list):
        raise InputError(f"must be a list of chat messages, got {type(value).__name__}", field="messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise InputError("must be an object", field=f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise InputError(f"role must be one of {', '.join(ROLES)}, got {role!r}", field=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InputError("must be a string, a list of parts or null", field=f"messages[{i}].content")
        for k, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise InputError('must be an object whose "text" (if any) is a string',
                                 field=f"messages[{i}].content[{k}]")
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise InputError("must be a list", field=f"messages[{i}].tool_calls")
        for k, call in enumerate(calls or []):
            function = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name", ""), (str, type(None))):
                raise InputError('must be an object (OpenAI tool call: {"function": {"name": ..., "arguments": ...}})',
                                 field=f"messages[{i}].tool_calls[{k}]")
    return value


def parse_meter_output(value: Any, name: str) -> MeterOutput | None:
    """One ``meter`` entry: ``null`` (invalid reading) or an object with any of the four readings."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"must be an object or null, got {type(value).__name__}", field=name)
    unknown = set(value) - {"can_complete", "tokens_to_go", "logit", "score", "probability"}
    if unknown:
        raise InputError(f"unknown keys {sorted(unknown)}", field=name)
    can_complete = tokens_to_go = None
    if "can_complete" in value:
        can_complete = _as_bool(value["can_complete"], f"{name}.can_complete")
        raw = value.get("tokens_to_go")
        if can_complete and raw is None:
            raise InputError("must be a number when can_complete is true", field=f"{name}.tokens_to_go")
        if raw is not None:  # where b̂ is false it is optional: the work left if the task does complete
            tokens_to_go = _as_finite(raw, f"{name}.tokens_to_go", MAX_TOKENS_TO_GO)
            if tokens_to_go < 0:
                raise InputError(f"must be non-negative, got {raw!r}", field=f"{name}.tokens_to_go")
    elif "tokens_to_go" in value:
        raise InputError("tokens_to_go without can_complete", field=name)
    logit = _as_finite(value["logit"], f"{name}.logit") if "logit" in value else None
    score = _as_finite(value["score"], f"{name}.score") if "score" in value else None
    probability = _as_finite(value["probability"], f"{name}.probability") if "probability" in value else None
    if probability is not None and not 0.0 <= probability <= 1.0:
        raise InputError(f"must be in [0, 1], got {value['probability']!r}", field=f"{name}.probability")
    if can_complete is None and logit is None and score is None:
        raise InputError("an empty reading (use null for an invalid one)", field=name)
    return MeterOutput(can_complete, tokens_to_go, logit, score, probability)


def _optional_ids(step: dict, key: str, name: str) -> list[int] | None:
    """A step's optional list of token ids, validated."""
    value = step.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError("must be a list", field=f"{name}.{key}")
    if len(value) > MAX_STEP_TOKENS:
        raise InputError(f"has more than {MAX_STEP_TOKENS:,} tokens", field=f"{name}.{key}")
    return [_as_count(t, f"{name}.{key}[{k}]", MAX_TOKEN_ID) for k, t in enumerate(value)]


def parse_step(value: Any, name: str) -> Step:
    if not isinstance(value, dict):
        raise InputError("must be an object", field=name)
    token_ids = _optional_ids(value, "token_ids", name)
    prompt_ids = _optional_ids(value, "prompt_ids", name)
    logprobs = value.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, list):
            raise InputError("must be a list", field=f"{name}.logprobs")
        logprobs = [_as_finite(x, f"{name}.logprobs[{k}]") for k, x in enumerate(logprobs)]
        if token_ids is not None and len(logprobs) != len(token_ids):
            raise InputError(f"has {len(logprobs)} entries for {len(token_ids)} token_ids", field=f"{name}.logprobs")
    observation = value.get("observation")
    if observation is not None and not isinstance(observation, str):
        raise InputError("must be a string", field=f"{name}.observation")
    reward = _as_finite(value.get("reward", 0.0), f"{name}.reward")
    verified = value.get("verified")
    if verified is not None:
        verified = _as_bool(verified, f"{name}.verified")
    command, error = value.get("command"), value.get("error")
    for key, text in (("command", command), ("error", error)):
        if text is not None and not isinstance(text, str):
            raise InputError("must be a string", field=f"{name}.{key}")
    return Step(observation=observation, token_ids=token_ids, logprobs=logprobs, prompt_ids=prompt_ids, reward=reward,
                verified=verified, command=command, error=error)  # fmt: skip


def parse_trajectory(record: dict) -> Trajectory:
    """Validate one JSON record into a ``Trajectory``; any problem raises ``InputError`` naming the field."""
    traj = Trajectory(
        id=_as_id(_require(record, "id"), "id"),
        group=_as_id(_require(record, "group"), "group"),
        reward=_as_finite(_require(record, "reward"), "reward"),
        success=_as_bool(_require(record, "success"), "success"),
        extra={k: v for k, v in record.items() if k not in KNOWN_FIELDS},
    )
    if record.get("policy") is not None:
        traj.policy = _as_id(record["policy"], "policy")
    if "messages" in record:
        traj.messages = parse_messages(record["messages"])
    if record.get("step_tokens") is not None:
        raw = record["step_tokens"]
        if not isinstance(raw, list):
            raise InputError(f"must be a list of token counts, got {type(raw).__name__}", field="step_tokens")
        traj.step_tokens = [_as_count(n, f"step_tokens[{t}]") for t, n in enumerate(raw)]
    if record.get("steps") is not None:
        if not isinstance(record["steps"], list):
            raise InputError("must be a list", field="steps")
        traj.steps = [parse_step(s, f"steps[{t}]") for t, s in enumerate(record["steps"])]
    if traj.messages is None and traj.step_tokens is None and traj.steps is None:
        raise InputError("a trajectory needs messages or step_tokens", field="messages")
    _check_step_counts(traj)
    if record.get("meter") is not None:
        raw = record["meter"]
        if not isinstance(raw, list):
            raise InputError("must be a list with one entry per step", field="meter")
        if len(raw) != traj.num_steps:
            raise InputError(f"has {len(raw)} entries but the trajectory has {traj.num_steps} steps", field="meter")
        traj.meter = [parse_meter_output(m, f"meter[{t}]") for t, m in enumerate(raw)]
    if record.get("answer_logprobs") is not None:
        traj.answer_logprobs = parse_answer_logprobs(record["answer_logprobs"], traj.num_steps)
    return traj


def parse_answer_logprobs(value: Any, num_steps: int) -> list[float]:
    """``answer_logprobs``: T + 1 finite log-probabilities (each <= 0), one before the first step and one after each."""
    if not isinstance(value, list):
        raise InputError(f"must be a list of {num_steps + 1} log-probabilities (one before the first step and one "
                         f"after each), got {type(value).__name__}", field="answer_logprobs")  # fmt: skip
    if len(value) != num_steps + 1:
        raise InputError(f"has {len(value)} entries but the trajectory has {num_steps} steps: it needs {num_steps + 1} "
                         "(after 0..T steps)", field="answer_logprobs")  # fmt: skip
    out = [_as_finite(x, f"answer_logprobs[{t}]") for t, x in enumerate(value)]
    for t, x in enumerate(out):
        if x > 0:
            raise InputError(f"must be <= 0 (a log-probability), got {value[t]!r}", field=f"answer_logprobs[{t}]")
    return out


def _check_step_counts(traj: Trajectory) -> None:
    counts = {}
    if traj.messages is not None:
        counts["messages"] = len(assistant_indices(traj.messages))
    if traj.step_tokens is not None:
        counts["step_tokens"] = len(traj.step_tokens)
    if traj.steps is not None:
        counts["steps"] = len(traj.steps)
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise InputError(f"step counts disagree ({detail})", field="step_tokens" if "step_tokens" in counts else "steps")
