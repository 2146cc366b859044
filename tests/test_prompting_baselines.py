"""The paper's prompting baselines: ReAct (a thought, then the action; only the action reaches the environment, the
transcript keeps the thought) and Reflexion (up to 3 trials per task, a self-reflection after each failed one shown
to the next trial, stopping at the first success)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

from deltattg.cli import main
from deltattg.data.trajectory import Trajectory, parse_trajectory
from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.rollout.collect import PolicySpec, parse_policy
from deltattg.rollout.engine import Action, Episode, run_episodes
from deltattg.rollout.evaluate import EPISODES_FILE, RESULTS_JSON, RESULTS_MD
from deltattg.rollout.policies import ChatPolicy, LMPolicy, SamplingConfig
from deltattg.rollout.prompts import REACT_INSTRUCTION, PromptConfig, episode_prompt, parse_react_action
from deltattg.rollout.reflexion import REFLECTION_PROMPT, Reflexion, reflection_messages, run_reflexion
from deltattg.tiny import tiny_llama, word_tokenizer

CONFIG = HouseholdConfig.short()
EXTRA_WORDS = ("Thought Action Answer format first short reasoning about what do next then single action Only is "
               "executed attempt failed reflections trials step of plan").split()


class RecordingEnv(HouseholdEnv):
    """The household environment, keeping every command it was asked to execute."""

    def __init__(self) -> None:
        super().__init__(CONFIG)
        self.executed: list[str] = []

    def step(self, action: str):
        self.executed.append(action)
        return super().step(action)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(vocabulary(CONFIG) + EXTRA_WORDS)


@pytest.fixture(scope="module")
def tiny_model(tokenizer, one_torch_thread):
    return tiny_llama(tokenizer, hidden=32, layers=1, heads=2).eval()


# ---- ReAct ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, action", [
    ("Thought: the mug is on the desk.\nAction: go to desk 1", "go to desk 1"),
    ("Thought: I should go.  Action:   take mug 1 from desk 1  \n", "take mug 1 from desk 1"),
    ("Thought: first Action: look, no wait.\nAction: open drawer 1", "open drawer 1"),  # the last Action: counts
    ("  go to shelf 2\n", "go to shelf 2"),  # no Action: the whole reply, stripped
    ("Thought: I will act later.", "Thought: I will act later."),
    ("Thought: done. Action:", ""),
    ('Action: {"name": "ls", "arguments": {}}', '{"name": "ls", "arguments": {}}'),
    ("action: go to desk 1", "action: go to desk 1"),  # the marker is case-sensitive
])  # fmt: skip
def test_react_action_parsing(reply, action):
    assert parse_react_action(reply) == action


class ScriptedReAct(ChatPolicy):
    """A chat policy whose backend "generates" a thought plus the planner's action (the prompts it was given are
    kept), so the ReAct plumbing of ``ChatPolicy`` is exercised without a learned model."""

    def __init__(self, tokenizer, layout: str):
        prompt = PromptConfig(layout=layout, react=True)  # type: ignore[arg-type]
        super().__init__(tokenizer, SamplingConfig(), prompt, "scripted-react")
        self.episodes: list[Episode] = []
        self.prompts: list[list[int]] = []

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        self.episodes = list(episodes)
        return super().act(episodes)

    def generate(self, prompts: list[list[int]]) -> list[Action]:
        self.prompts += prompts
        return [Action(f"Thought: step {len(e.steps)} of the plan.\nAction: {e.env.expert_action()}", [1], [0.0], p)
                for e, p in zip(self.episodes, prompts)]


@pytest.mark.parametrize("layout", ["window", "chat"])
def test_the_environment_runs_the_action_and_the_transcript_keeps_the_thought(tokenizer, layout):
    envs: list[RecordingEnv] = []

    def make_env() -> RecordingEnv:
        envs.append(RecordingEnv())
        return envs[-1]

    policy = ScriptedReAct(tokenizer, layout)
    tasks = make_env().tasks("valid_seen")[:3]
    envs.clear()
    trajectories = run_episodes(make_env, tasks, policy)
    assert all(t.success for t in trajectories)  # the planner's actions, parsed out of the replies, won every task
    for env, trajectory in zip(envs, trajectories):
        replies = [m["content"] for m in trajectory.messages[2::2]]
        assert all(r.startswith("Thought: step ") and "\nAction: " in r for r in replies)
        assert env.executed == [parse_react_action(r) for r in replies]  # only the actions, never a thought
        assert not any("Thought" in command for command in env.executed)
    # every prompt asked for the format, and from the second turn on it shows the model its own earlier thought
    texts = [tokenizer.decode(p) for p in policy.prompts]
    assert all("Thought" in t and "Only the action is executed" in t for t in texts)
    assert any("step 0 of the plan" in t for t in texts)
    # without react the same prompt has no instruction
    plain = PromptConfig(layout=layout)  # type: ignore[arg-type]
    episode = Episode(envs[0], tasks[0], 0, [{"role": "system", "content": "S"}, {"role": "user", "content": "O"}],
                      "O", "O", None)  # fmt: skip
    assert episode_prompt(episode, plain)[0]["content"] == "S"
    react = PromptConfig(layout=layout, react=True)  # type: ignore[arg-type]
    assert episode_prompt(episode, react)[0]["content"] == f"S\n\n{REACT_INSTRUCTION}"


def test_a_react_lm_records_its_whole_reply_and_executes_the_parsed_action(tokenizer, tiny_model):
    envs: list[RecordingEnv] = []

    def make_env() -> RecordingEnv:
        envs.append(RecordingEnv())
        return envs[-1]

    policy = LMPolicy(tiny_model, tokenizer, SamplingConfig(temperature=1.0, max_new_tokens=8),
                      PromptConfig(react=True), name="react:tiny")  # fmt: skip
    torch.manual_seed(0)
    tasks = make_env().tasks("valid_seen")[:2]
    envs.clear()
    for env, trajectory in zip(envs, run_episodes(make_env, tasks, policy, max_turns=3)):
        replies = [m["content"] for m in trajectory.messages[2::2]]
        assert env.executed == [parse_react_action(r) for r in replies]
        for reply, step in zip(replies, trajectory.steps or []):  # the tokens trained on are the whole reply
            assert tokenizer.decode(step.token_ids, skip_special_tokens=True).strip() == reply
            assert "Only the action is executed" in tokenizer.decode(step.prompt_ids)


def test_policy_specs():
    assert parse_policy("react:smollm2") == PolicySpec("react", model="smollm2")
    assert parse_policy("react:smollm2").name == "react:smollm2" and parse_policy("react:x").is_model
    assert parse_policy("reflexion:smollm2", trials=True).name == "reflexion:smollm2"
    for spec in ("reflexion:smollm2", "react:", "reflexion:"):
        with pytest.raises(ValueError):
            parse_policy(spec)  # collect and guide play one episode per task: no Reflexion there
    with pytest.raises(ValueError, match="only `deltattg evaluate`"):
        parse_policy("reflexion:smollm2")


# ---- Reflexion --------------------------------------------------------------------------------------------------
class ScriptedReflexion:
    """Acts with the planner once its prompt shows at least ``needs`` reflections, else only ``look`` (a failure);
    reflects with a numbered note. Records what it was shown and asked."""

    def __init__(self, needs: int):
        self.name = "scripted"
        self.needs = needs
        self.reflected: list[Trajectory] = []
        self.shown: dict[str, set[int]] = {}  # task id -> the reflection counts its prompts showed

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        actions = []
        for episode in episodes:
            system = episode_prompt(episode, PromptConfig())[0]["content"]
            seen = sum(f"note {k} " in system for k in range(1, 10))
            self.shown.setdefault(episode.task.id, set()).add(seen)
            actions.append(Action(episode.env.expert_action() if seen >= self.needs else "look"))
        return actions

    def reflect(self, trajectories: Sequence[Trajectory]) -> list[str]:
        self.reflected += trajectories
        return [f"note {len(self.reflected) - len(trajectories) + k + 1} about {t.group}"
                for k, t in enumerate(trajectories)]


def make_env() -> HouseholdEnv:
    return HouseholdEnv(CONFIG)


@pytest.mark.parametrize("needs, trials, success", [(0, 1, True), (1, 2, True), (2, 3, True), (3, 3, False)])
def test_reflexion_stops_at_the_first_success_and_carries_the_reflections(needs, trials, success):
    actor = ScriptedReflexion(needs)
    task = make_env().tasks("valid_seen")[0]
    finished: list[Trajectory] = []
    [trajectory] = run_reflexion(make_env, [task], actor, max_turns=20, on_finish=finished.append)
    assert finished == [trajectory] and trajectory.success is success
    record = trajectory.extra["reflexion"]
    assert record["trials"] == trials and record["max_trials"] == 3
    assert record["outcomes"] == [False] * (trials - 1) + [success]
    # a reflection after each failed trial but the last, each one shown to every later trial
    assert len(actor.reflected) == trials - 1
    assert actor.shown[task.id] == set(range(trials))
    assert record["reflections"] == [f"note {k} about {task.id}" for k in range(1, trials)]
    assert all(f"note {k} about" in trajectory.messages[0]["content"] for k in range(1, trials))
    # the record keeps its trial history through the JSONL format
    assert parse_trajectory(json.loads(json.dumps(trajectory.to_json()))).extra["reflexion"] == record


def test_reflexion_plays_the_tasks_still_failing_together():
    actor = ScriptedReflexion(needs=1)
    tasks = make_env().tasks("valid_seen")[:4]
    trajectories = run_reflexion(make_env, tasks, actor, max_turns=20)
    assert [t.group for t in trajectories] == [t.id for t in tasks]
    assert all(t.success and t.extra["reflexion"]["trials"] == 2 for t in trajectories)
    assert sorted(t.group for t in actor.reflected) == sorted(t.id for t in tasks)  # one reflection each
    with pytest.raises(ValueError):
        run_reflexion(make_env, tasks, actor, trials=0)


def test_an_lm_reflects_on_the_failed_transcript(tokenizer, tiny_model):
    policy = LMPolicy(tiny_model, tokenizer, SamplingConfig(temperature=1.0, max_new_tokens=6),
                      PromptConfig(react=True), name="reflexion:tiny")  # fmt: skip
    actor = Reflexion(policy)
    torch.manual_seed(0)
    tasks = make_env().tasks("valid_seen")[:2]
    trajectories = run_reflexion(make_env, tasks, actor, max_turns=2)
    for trajectory in trajectories:  # a random model fails every trial: three, two reflections shown to the last
        record = trajectory.extra["reflexion"]
        assert (record["trials"], trajectory.success, len(record["reflections"])) == (3, False, 2)
        assert all(note in trajectory.messages[0]["content"] for note in record["reflections"])
    prompt = reflection_messages(trajectories[0])[-1]["content"]
    assert prompt.endswith(REFLECTION_PROMPT) and "> " in prompt and trajectories[0].messages[1]["content"] in prompt


def test_evaluate_reflexion_from_a_model_folder(tmp_path, tokenizer, tiny_model):
    folder = tmp_path / "actor"
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "eval"
    argv = ["evaluate", "--env", "household", "--short", "--no-progress", "--split", "valid_seen", "--episodes", "2",
            "--max-turns", "2", "--max-new-tokens", "4", "--temperature", "0", "--threads", "1", "--out", str(out)]
    assert main([*argv, "--actor", f"reflexion:{folder}"]) == 0
    report = json.loads((out / RESULTS_JSON).read_text())
    assert report["actor"] == f"reflexion:{folder}" and report["episodes"] == 2
    assert report["trials"]["max"] == 3 and 1 <= report["trials"]["avg_used"] <= 3
    records = [json.loads(line) for line in (out / EPISODES_FILE).read_text().splitlines()]
    assert len(records) == 2 and all(1 <= r["reflexion"]["trials"] <= 3 for r in records)
    assert "Reflexion: up to 3 trials" in (out / RESULTS_MD).read_text()
    assert main([*argv, "--actor", f"reflexion:{folder}"]) == 0  # resumes: nothing left to play, same trials read back
    assert json.loads((out / RESULTS_JSON).read_text())["trials"] == report["trials"]
    react = tmp_path / "react"
    assert main([*argv[:-1], str(react), "--actor", f"react:{folder}"]) == 0
    report = json.loads((react / RESULTS_JSON).read_text())
    assert report["actor"] == f"react:{folder}" and "trials" not in report
