"""The household oracle meter: on the noiseless expert's trajectories it reads exactly ``deltattg labels``; on any
trajectory b̂ is "the optimal plan fits in the turns left" and v̂ the expert's remaining tokens; its noise and flips
are seeded per state; records it cannot replay are refused with their file and line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from deltattg.cli import main
from deltattg.data.jsonl import write_jsonl
from deltattg.data.sources import read_trajectories
from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.envs.household.progress import replay
from deltattg.meter.loading import read_states
from deltattg.meter.oracle import OracleConfig, OracleMeter
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import NoisyExpertPolicy
from deltattg.tiny import word_tokenizer
from conftest import needs_smollm2

CONFIG = HouseholdConfig.short()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    word_tokenizer(vocabulary(CONFIG)).save_pretrained(out)
    return out


def collect(tmp_path, policy: str, episodes: int, *extra: str):
    out = tmp_path / f"{policy.replace(':', '_')}.jsonl"
    assert main(["collect", "--env", "household", "--short", "--policy", policy, "--episodes", str(episodes),
                 "--out", str(out), "--no-progress", *extra]) == 0  # fmt: skip
    return out


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("tokenizer", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_oracle_reads_the_labels_on_noiseless_expert_trajectories(tmp_path, tokenizer_dir, tokenizer):
    if tokenizer == "smollm2":
        needs_smollm2()
    spec = str(tokenizer_dir) if tokenizer == "tiny" else tokenizer
    pool = collect(tmp_path, "expert", 30)
    assert main(["labels", str(pool), "--out", str(tmp_path / "labels.jsonl"), "--tokenizer", spec, "--no-progress"]) == 0
    assert main(["score", str(pool), "--meter", "oracle", "--tokenizer", spec, "--out", str(tmp_path / "s.jsonl"),
                 "--no-progress"]) == 0  # fmt: skip
    labels = read_jsonl(tmp_path / "labels.jsonl")
    readings = [r for record in read_jsonl(tmp_path / "s.jsonl") for r in record["meter"]]
    assert len(readings) == len(labels) > 100
    assert readings == [{"can_complete": True, "tokens_to_go": label["tokens_to_go"]} for label in labels]


def test_oracle_is_the_planner_on_noisy_trajectories(tmp_path, tokenizer_dir):
    """b̂ = (d_t ≤ turns left), v̂ = tokens of the expert's remaining actions, both read off an independent replay that
    records the planner's distance and plan at every state."""
    tokenizer = word_tokenizer(vocabulary(CONFIG))
    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    tasks = make_env().tasks("train")[:12]
    trajectories = run_episodes(make_env, tasks, NoisyExpertPolicy(0.5, seed=1), group_size=2, max_turns=8)
    readings, stats = read_states(OracleMeter(tokenizer), trajectories)
    assert stats.sent == len(trajectories) and stats.invalid == 0
    checked = flips = 0
    for trajectory, row in zip(trajectories, readings):
        env = make_env()
        env.reset(next(t for t in tasks if t.id == trajectory.group))
        actions = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
        for t, (action, reading) in enumerate(zip(actions, row)):
            expert, remaining = env.snapshot(), []
            while env.expert_action() is not None:  # the expert's own path from here, then back
                remaining.append(env.expert_action())
                env.step(remaining[-1])
            env.restore(expert)
            tokens = sum(len(tokenizer(a)["input_ids"]) + 1 for a in remaining)  # words + end of turn
            assert reading.can_complete == (env.optimal_remaining() <= 8 - t)
            assert reading.tokens_to_go == tokens and len(remaining) == env.optimal_remaining()
            flips += t > 0 and reading.can_complete != row[t - 1].can_complete
            checked += 1
            env.step(action)
    assert checked > 60 and flips > 0  # some trajectories ran out of turns on the way


def test_a_harmful_action_raises_the_oracle_cost(tokenizer_dir):
    tokenizer = word_tokenizer(vocabulary(CONFIG))
    env = HouseholdEnv(CONFIG)
    task = env.tasks("train")[3]
    env.reset(task)
    before = []  # expert actions up to the first state where a harmful action exists
    while not any(env.is_harmful(a) for a in env.admissible_actions()):
        before.append(env.expert_action())
        env.step(before[-1])
    harmful = next(a for a in env.admissible_actions() if env.is_harmful(a))
    episodes = []
    for action in (env.expert_action(), harmful):
        script = Scripted([*before, action, "look"])
        episodes += run_episodes(lambda: HouseholdEnv(CONFIG), [task], script, max_turns=len(before) + 2)
    (progress, regress), _ = read_states(OracleMeter(tokenizer), episodes)
    t = len(before)
    assert progress[t] == regress[t]  # the same state before the two actions
    assert progress[t + 1].tokens_to_go < progress[t].tokens_to_go < regress[t + 1].tokens_to_go


class Scripted:
    """Plays a fixed list of actions."""

    name = "scripted"

    def __init__(self, actions):
        self.actions = actions

    def act(self, episodes):
        from deltattg.rollout.engine import Action

        return [Action(self.actions[len(e.steps)]) for e in episodes]


def test_noise_and_flips_are_seeded_per_state(tmp_path, tokenizer_dir):
    tokenizer = word_tokenizer(vocabulary(CONFIG))
    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    trajectories = run_episodes(make_env, make_env().tasks("train")[:40], NoisyExpertPolicy(0.3, seed=2), max_turns=12)
    exact, _ = read_states(OracleMeter(tokenizer), trajectories)
    noisy, _ = read_states(OracleMeter(tokenizer, OracleConfig(noise=0.5, flip=0.2, seed=7)), trajectories)
    reversed_order, _ = read_states(OracleMeter(tokenizer, OracleConfig(noise=0.5, flip=0.2, seed=7)), trajectories[::-1])
    assert noisy == reversed_order[::-1]  # a reading depends on its state and the seed, not on the batch
    other_seed, _ = read_states(OracleMeter(tokenizer, OracleConfig(noise=0.5, flip=0.2, seed=8)), trajectories)
    assert other_seed != noisy
    pairs = [(e, n) for row_e, row_n in zip(exact, noisy) for e, n in zip(row_e, row_n)]
    assert len(pairs) > 250
    log_ratios = [math.log(n.tokens_to_go / e.tokens_to_go) for e, n in pairs if e.tokens_to_go > 0]
    assert np.std(log_ratios) == pytest.approx(0.5, rel=0.15) and abs(np.mean(log_ratios)) < 0.1
    flipped = np.mean([e.can_complete != n.can_complete for e, n in pairs])
    assert flipped == pytest.approx(0.2, abs=0.06)
    everything, _ = read_states(OracleMeter(tokenizer, OracleConfig(flip=1.0)), trajectories)
    assert all(e.can_complete != f.can_complete for row_e, row_f in zip(exact, everything) for e, f in zip(row_e, row_f))
    with pytest.raises(ValueError, match="flip"):
        OracleConfig(flip=1.5)
    with pytest.raises(ValueError, match="noise"):
        OracleConfig(noise=float("nan"))


def test_the_outcome_conditioned_errors_hit_only_their_side(tmp_path, tokenizer_dir):
    """false_negative reads b̂ = 0 only on successful trajectories' states; missed_failure reads b̂ = 1 only on failed
    trajectories' states the planner knows lost; neither touches v̂ or the other side; a partial rate is seeded."""
    tokenizer = word_tokenizer(vocabulary(CONFIG))
    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    trajectories = run_episodes(make_env, make_env().tasks("train")[:40], NoisyExpertPolicy(0.5, seed=3), max_turns=8)
    outcomes = [t.success for t in trajectories]
    assert 0 < sum(outcomes) < len(outcomes)
    exact, _ = read_states(OracleMeter(tokenizer), trajectories)
    alarms, _ = read_states(OracleMeter(tokenizer, OracleConfig(false_negative=1.0)), trajectories)
    misses, _ = read_states(OracleMeter(tokenizer, OracleConfig(missed_failure=1.0)), trajectories)
    for won, row_e, row_a, row_m in zip(outcomes, exact, alarms, misses):
        for e, a, m in zip(row_e, row_a, row_m):
            assert a.tokens_to_go == m.tokens_to_go == e.tokens_to_go
            assert a.can_complete == (False if won else e.can_complete)
            assert m.can_complete == (e.can_complete if won else True)
    lost = sum(not e.can_complete for won, row in zip(outcomes, exact) if not won for e in row)
    assert lost > 20  # failed trajectories do pass through states the planner knows lost
    half, _ = read_states(OracleMeter(tokenizer, OracleConfig(missed_failure=0.5, seed=1)), trajectories)
    missed = sum(h.can_complete and not e.can_complete for row_e, row_h in zip(exact, half) for e, h in zip(row_e, row_h))
    assert missed / lost == pytest.approx(0.5, abs=0.2)
    with pytest.raises(ValueError, match="false negative"):
        OracleConfig(false_negative=-0.1)


def test_records_that_do_not_replay_are_refused_with_file_and_line(tmp_path, tokenizer_dir, capsys):
    pool = collect(tmp_path, "expert:0.3", 4)
    records = read_jsonl(pool)
    bad = [dict(records[0]), dict(records[1]), dict(records[2])]
    del bad[1]["env"]  # no provenance
    bad[2]["messages"] = [dict(m) for m in bad[2]["messages"]]
    bad[2]["messages"][3]["content"] = "You arrive at nowhere."  # an observation the environment never gave
    for k, field in ((1, "env"), (2, "messages[3].content")):
        path = tmp_path / f"bad{k}.jsonl"
        write_jsonl(path, [bad[0], bad[k]])  # the bad record on line 2
        out = tmp_path / f"out{k}.jsonl"
        code = main(["score", str(path), "--meter", "oracle", "--tokenizer", str(tokenizer_dir), "--out", str(out),
                     "--no-progress"])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and f"{path}:2: {field}:" in err and not out.exists(), err
    for args, message in ((["--meter", "oracle"], "--tokenizer"),
                          (["--meter", str(tmp_path / "meter"), "--oracle-noise", "0.3"], "--meter oracle"),
                          (["--meter", "oracle", "--tokenizer", str(tokenizer_dir), "--oracle-flip", "2"], "flip")):
        with pytest.raises(SystemExit) as exit_info:
            main(["score", str(pool), "--out", str(tmp_path / "o.jsonl"), *args])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
    items, _ = read_trajectories(pool)
    assert replay(items[0].trajectory).max_turns == CONFIG.max_steps


def test_a_turn_limit_below_the_records_own_actions_is_refused(tmp_path, tokenizer_dir, capsys):
    """No episode outlives its turn limit: a successful record of T actions claiming a limit under T (which would read
    every one of its states "cannot complete") is refused with its file, line and field; a limit of exactly T reads."""
    records = read_jsonl(collect(tmp_path, "expert", 4))
    actions = [sum(m["role"] == "assistant" for m in r["messages"]) for r in records]
    k = max(range(len(records)), key=lambda i: actions[i])
    assert records[k]["success"] and actions[k] >= 3
    for limit, code in ((actions[k] - 1, 2), (actions[k], 0)):
        changed = {**records[k], "env": {**records[k]["env"], "max_turns": limit}}
        path, out = tmp_path / f"limit{limit}.jsonl", tmp_path / f"scored{limit}.jsonl"
        write_jsonl(path, [records[(k + 1) % len(records)], changed])  # the record on line 2
        assert main(["score", str(path), "--meter", "oracle", "--tokenizer", str(tokenizer_dir), "--out", str(out),
                     "--no-progress"]) == code  # fmt: skip
        err = capsys.readouterr().err
        if code:
            assert f"{path}:2: env.max_turns: a turn limit of {limit} is smaller than the record's own" in err, err
            assert not out.exists()
        else:
            assert all(r["can_complete"] for r in read_jsonl(out)[1]["meter"])


def test_actions_given_as_content_parts_replay_like_plain_text():
    """An assistant ``content`` that is a list of parts (valid OpenAI chat) replays to the same states as plain text
    (it was read as ``str(list)``, an unknown command, so the replay diverged)."""
    from dataclasses import replace

    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    trajectories = run_episodes(make_env, make_env().tasks("train")[:4], NoisyExpertPolicy(0.3, seed=2), max_turns=8)
    for trajectory in trajectories:
        parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} if m["role"] == "assistant" else m
                 for m in trajectory.messages]  # fmt: skip
        assert replay(replace(trajectory, messages=parts)).states == replay(trajectory).states
        assert len(replay(trajectory).states) == trajectory.num_steps + 1
