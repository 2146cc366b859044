"""Labels from replayed states (issue 34): the checked replay of a recorded state, the rollout / best-of-k / td label
arithmetic worked by hand, ``deltattg labels --labels SOURCE`` against the planner on a household pool and
``train-meter --labels`` naming its source (what a label file may be trusted with: ``test_label_files.py``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from deltattg.cli import main
from deltattg.data.labels import (
    Continuation,
    LabelSettings,
    best_of_k_labels,
    completion_rounds,
    rollout_label,
    td_labels,
)
from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import NoisyExpertPolicy
from deltattg.envs.replay import check_replay, recorded_episode
from deltattg.rollout.replay import resume
from conftest import collect_household, save_household_tokenizer

CONFIG = HouseholdConfig.short()


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def household_trajectories(episodes: int = 8, epsilon: float = 0.5, seed: int = 1):
    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    return run_episodes(make_env, make_env().tasks("train")[:episodes], NoisyExpertPolicy(epsilon, seed=seed),
                        max_turns=8)  # fmt: skip


# ---- label arithmetic by hand ------------------------------------------------------------------------------------------
def test_best_of_k_labels_by_hand():
    """A failed trajectory of 3 actions (n = 5, 7, 9). s_2: no completion succeeded; s_1: one in 20 tokens; s_0: none,
    but the recorded action (5 tokens) then s_1's success proves it completable in 25. A state that did not replay
    keeps its outcome label; the terminal state is the outcome."""
    lost, won = Continuation(False, 30.0), Continuation(True, 20.0)
    labels = best_of_k_labels(False, [5, 7, 9], [[lost, lost], [lost, won], [lost, lost]])
    assert [(x.can_complete, x.tokens_to_go, x.source) for x in labels] == [
        (True, 25.0, "best-of-k"), (True, 20.0, "best-of-k"), (False, None, "best-of-k"), (False, None, "outcome")]
    # A successful trajectory: its own remaining tokens (9 + 7 at s_1) unless a completion is shorter (12 < 16).
    labels = best_of_k_labels(True, [5, 7, 9], [[lost], [Continuation(True, 12.0)], [lost]])
    assert [x.tokens_to_go for x in labels] == [17.0, 12.0, 9.0, 0.0] and all(x.can_complete for x in labels)
    # s_2 did not replay (nor, then, could anything after it): its label is the outcome's.
    labels = best_of_k_labels(False, [5, 7, 9], [[won], [lost], None])
    assert [(x.can_complete, x.source) for x in labels] == [(True, "best-of-k"), (False, "best-of-k"),
                                                            (False, "outcome"), (False, "outcome")]
    with pytest.raises(ValueError, match="completions"):
        best_of_k_labels(False, [5, 7], [[lost]])


def test_rollout_label_by_hand():
    """b̃ = 1 of 4 succeeded = 0.25 (hard b = b̃ ≥ 1/2: false); v = the successful ones' mean remaining tokens."""
    label = rollout_label([Continuation(True, 10.0), Continuation(False, 3.0), Continuation(False, 8.0),
                           Continuation(False, 1.0)])  # fmt: skip
    assert (label.can_complete, label.completion_rate, label.tokens_to_go, label.target) == (False, 0.25, 10.0, 0.25)
    label = rollout_label([Continuation(True, 10.0), Continuation(True, 20.0)])
    assert (label.can_complete, label.tokens_to_go, label.target) == (True, 15.0, 1.0)
    assert rollout_label([Continuation(False, 4.0)]).tokens_to_go is None


def test_td_labels_by_hand():
    """n = (4, 6), readings (p̂, v̂) of s_0..s_2; λ = 0: b̃_1 = p̂_2 → anchored at the outcome (success: 1, v 0), so
    b̃_1 = 1, v_1 = 6 + 0; b̃_0 = p̂_1 = 0.3, v_0 = 4 + v̂_1 = 4 + 50. λ = 1 gives the outcome labels; λ = 0.5 mixes."""
    readings = [(0.9, 80.0), (0.3, 50.0), (0.0, 7.0)]
    zero = td_labels(True, [4, 6], readings, 0.0)
    assert [(x.completion_rate, x.tokens_to_go) for x in zero] == [(0.3, 54.0), (1.0, 6.0), (1.0, 0.0)]
    one = td_labels(True, [4, 6], readings, 1.0)
    assert [(x.completion_rate, x.tokens_to_go) for x in one] == [(1.0, 10.0), (1.0, 6.0), (1.0, 0.0)]
    half = td_labels(True, [4, 6], readings, 0.5)
    assert [(x.completion_rate, x.tokens_to_go) for x in half] == [(0.65, 4 + 0.5 * 50 + 0.5 * 6), (1.0, 6.0),
                                                                   (1.0, 0.0)]
    # A failed trajectory: v is bootstrapped from v̂ alone; a missing reading passes the later return on.
    failed = td_labels(False, [4, 6], [(0.9, 80.0), None, (0.2, 7.0)], 0.0)
    assert [(x.completion_rate, x.tokens_to_go) for x in failed] == [(0.0, None), (0.0, None), (0.0, None)]
    assert [x.can_complete for x in failed] == [False, False, False]
    failed = td_labels(False, [4, 6], [(0.9, 80.0), (0.7, 20.0), (0.2, 7.0)], 0.0)
    assert [(x.completion_rate, x.tokens_to_go) for x in failed] == [(0.7, 24.0), (0.0, None), (0.0, None)]


def test_completion_rounds_double_up_to_k():
    assert [completion_rounds(k) for k in (1, 2, 3, 4, 5, 8)] == [[1], [1, 1], [1, 1, 1], [1, 1, 2], [1, 1, 2, 1],
                                                                   [1, 1, 2, 4]]


def test_label_settings_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="--completer"):
        LabelSettings("best-of-k")
    with pytest.raises(ValueError, match="--completer plays"):
        LabelSettings("outcome", completer="random")
    with pytest.raises(ValueError, match="--bootstrap-meter"):
        LabelSettings("td")
    with pytest.raises(ValueError, match="unknown label source"):
        LabelSettings("oracle")
    with pytest.raises(ValueError, match="best-of-k only"):
        LabelSettings("rollout", completer="random", until_success=True)
    assert LabelSettings("rollout", completer="random", completions=2).to_json() == {
        "source": "rollout", "completer": "random", "completions": 2, "seed": 0}


# ---- checked replay --------------------------------------------------------------------------------------------------
def test_every_recorded_state_replays_and_a_changed_observation_stops_it():
    trajectories = household_trajectories()
    for trajectory in trajectories:
        check = check_replay(recorded_episode(trajectory))
        assert check.exact and check.states == trajectory.num_steps + 1
    trajectory = next(t for t in trajectories if t.num_steps >= 4)
    messages = [dict(m) for m in trajectory.messages]
    messages[5]["content"] = "You arrive at nowhere."  # the observation after action 1
    check = check_replay(recorded_episode(replace(trajectory, messages=messages)))
    assert (check.replayed, check.exact, check.field) == (2, False, "messages[5].content")
    assert check.mismatch.startswith("does not replay")


def test_a_resumed_episode_is_where_the_record_was():
    """The episode resumed at s_t has the record's transcript up to t, its history and reward, and its environment
    answers the recorded action t as the record says."""
    trajectory = next(t for t in household_trajectories() if t.num_steps >= 3)
    recorded = recorded_episode(trajectory)
    for t in range(trajectory.num_steps):
        episode = resume(recorded, t)
        assert episode is not None and not episode.done
        assert episode.messages == trajectory.messages[: 2 + 2 * t]
        assert [a for a, _ in episode.history] == list(recorded.commands[:t])
        assert episode.env.step(recorded.commands[t]).observation == trajectory.messages[3 + 2 * t]["content"]


def test_a_record_without_provenance_cannot_be_replayed():
    trajectory = household_trajectories(1)[0]
    with pytest.raises(Exception, match="env"):
        recorded_episode(replace(trajectory, extra={k: v for k, v in trajectory.extra.items() if k != "env"}))


# ---- the commands ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The issue's household pool at a test's size: noisy experts and random, groups of 4, 12 turns."""
    folder = tmp_path_factory.mktemp("pool")
    tokenizer = save_household_tokenizer(folder / "tok")
    path = collect_household(folder / "pool.jsonl", ["expert:0.3", "expert:0.6", "random"], 8, "--group-size", "4",
                             "--max-turns", "12", "--tokenizer", str(tokenizer))  # fmt: skip
    return path, tokenizer


def balanced(pairs) -> float:
    pos = [p for truth, p in pairs if truth]
    neg = [not p for truth, p in pairs if not truth]
    return 0.5 * (sum(pos) / len(pos) + sum(neg) / len(neg))


def test_best_of_k_labels_read_what_the_planner_reads(pool, tmp_path, capsys):
    """With an expert completer, best-of-k's can_complete agrees with the planner's b (the optimal plan fits in the
    turns left) far better than the outcome labels do; every label says its source; every state replayed."""
    path, tokenizer = pool
    out = tmp_path / "L.jsonl"
    common = ["--env", "household", "--short", "--max-turns", "12", "--tokenizer", str(tokenizer), "--no-progress"]
    assert main(["labels", str(path), "--labels", "best-of-k", "--completer", "expert:0.3", "--completions", "4",
                 "--out", str(out), *common]) == 0  # fmt: skip
    assert " 0 of " in capsys.readouterr().err.split("did not replay")[0][-40:]  # every state replayed
    labels = read_jsonl(out)
    assert main(["labels", str(path), "--out", str(tmp_path / "O.jsonl"), "--tokenizer", str(tokenizer),
                 "--no-progress"]) == 0  # fmt: skip
    outcome = read_jsonl(tmp_path / "O.jsonl")
    assert [(r["id"], r["step"]) for r in labels] == [(r["id"], r["step"]) for r in outcome]
    assert all(r["source"] == "best-of-k" and r["replayed"] and r["completions"][1] == 4 for r in labels)
    assert all((r["tokens_to_go"] is None) == (not r["can_complete"]) for r in labels)
    assert main(["score", str(path), "--meter", "oracle", "--tokenizer", str(tokenizer), "--out",
                 str(tmp_path / "oracle.jsonl"), "--no-progress"]) == 0  # fmt: skip
    planner = [m["can_complete"] for r in read_jsonl(tmp_path / "oracle.jsonl") for m in r["meter"]]
    ours = balanced(list(zip(planner, [r["can_complete"] for r in labels])))
    theirs = balanced(list(zip(planner, [r["can_complete"] for r in outcome])))
    assert ours >= 0.95 and theirs <= 0.85, (ours, theirs)
    # A success proves completability: no label calls a state completable that the planner knows is not.
    assert not any(r["can_complete"] and not b for r, b in zip(labels, planner))


def test_until_success_stops_completing_a_state_once_it_is_proven_completable(pool, tmp_path, capsys):
    """``--until-success``: rounds of 1, 1, 2 completions (K = 4); a state that got fewer than 4 was proven completable
    first, a state labelled hopeless got all 4; the completions played are fewer than 4 per state."""
    path, tokenizer = pool
    out = tmp_path / "U.jsonl"
    assert main(["labels", str(path), "--labels", "best-of-k", "--completer", "random", "--completions", "4",
                 "--until-success", "--tokenizer", str(tokenizer), "--out", str(out), "--no-progress"]) == 0
    report = capsys.readouterr().err
    labels = read_jsonl(out)
    assert all(r["labelling"]["until_success"] for r in labels)
    assert all(r["can_complete"] for r in labels if r["completions"][1] < 4)
    assert all(r["completions"][1] == 4 for r in labels if not r["can_complete"])
    assert {r["completions"][1] for r in labels} <= {1, 2, 4}
    played = int(report.split(" completions,")[0].rsplit("; ", 1)[1])
    assert played < 4 * len(labels), report


def test_train_meter_learns_from_a_label_source_and_names_it(pool, tmp_path, capsys):
    """``train-meter --labels best-of-k --completer random --completions 2`` keeps the labels beside the pool and
    writes the source into meter_config.json; ``eval-meter --reference oracle`` reports the agreement keys."""
    from test_meter_regression import tiny_meter

    path, tokenizer = pool
    backbone = tmp_path / "tiny"
    tiny_meter().save_pretrained(backbone)
    out = tmp_path / "meter"
    assert main(["train-meter", str(path), "--out", str(out), "--model", str(backbone / "backbone"), "--labels",
                 "best-of-k", "--completer", "random", "--completions", "2", "--tokenizer", str(tokenizer),
                 "--head-epochs", "2"]) == 0  # fmt: skip
    config = json.loads((out / "meter_config.json").read_text())
    assert config["labels"] == {"source": "best-of-k", "completer": "random", "completions": 2, "seed": 0,
                                "tokenizer": str(tokenizer.resolve())}
    cached = list((path.parent / f"{path.name}.labels").glob("best-of-k-*.jsonl"))
    assert len(cached) == 1 and len(read_jsonl(cached[0])) == sum(r["step"] >= 0 for r in read_jsonl(cached[0]))
    report = json.loads((out / "train_report.json").read_text())
    assert report["labels"]["cost"]["completion_episodes"] > 0
    fit = tmp_path / "fit.json"
    assert main(["eval-meter", str(path), "--meter", str(out), "--reference", "oracle", "--tokenizer", str(tokenizer),
                 "--json", str(fit), "--no-progress"]) == 0  # fmt: skip
    reference = json.loads(fit.read_text())["reference"]
    assert {"b_balanced_accuracy", "ttg_spearman", "completion_agreement"} <= set(reference)
    assert 0 <= reference["b_balanced_accuracy"] <= 1


def test_bad_label_requests_are_refused_before_any_work(pool, tmp_path, capsys):
    """A record without its environment is refused with its file and line (nothing written); options that do not
    fit together are usage errors, refused before anything is read."""
    path, tokenizer = pool
    records = read_jsonl(path)
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps(records[0]) + "\n" + json.dumps({k: v for k, v in records[1].items() if k != "env"})
                    + "\n")  # fmt: skip
    out = tmp_path / "L.jsonl"
    common = ["--tokenizer", str(tokenizer), "--out", str(out), "--no-progress"]
    assert main(["labels", str(bare), "--labels", "best-of-k", "--completer", "random", *common]) == 2
    assert f"{bare}:2: env: missing" in capsys.readouterr().err and not out.exists()
    for extra, message in ((["--labels", "best-of-k"], "--completer"),
                           (["--labels", "rollout", "--completer", "nonsense"], "unknown policy"),
                           (["--labels", "td"], "--bootstrap-meter"),
                           (["--completer", "random"], "--completer plays"),
                           (["--labels", "best-of-k", "--completer", "random", "--target", "steps"], "--target"),
                           (["--labels", "best-of-k", "--completer", "random", "--short"], "--env")):
        with pytest.raises(SystemExit) as exit_info:
            main(["labels", str(path), *extra, *common])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, extra
        assert not out.exists()


def test_td_labels_bootstrap_from_the_meters_reading_of_the_next_state(pool, tmp_path):
    """``--labels td --td-lambda 0``: state t's target is the meter's p̃ of state t + 1 (as ``score`` reads it) and
    the last state's is the outcome; v_t = n_t + v̂_{t+1}."""
    from test_meter_regression import tiny_meter

    path, tokenizer = pool
    meter = tmp_path / "meter"
    tiny_meter().save_pretrained(meter)
    common = ["--tokenizer", str(tokenizer), "--no-progress"]
    out, scored = tmp_path / "T.jsonl", tmp_path / "S.jsonl"
    assert main(["labels", str(path), "--labels", "td", "--bootstrap-meter", str(meter), "--out", str(out),
                 *common]) == 0  # fmt: skip
    assert main(["score", str(path), "--meter", str(meter), "--out", str(scored), *common]) == 0
    labels = {(r["id"], r["step"]): r for r in read_jsonl(out)}
    for record in read_jsonl(scored):
        readings, tokens = record["meter"], record["step_tokens"]
        last = len(readings) - 1
        for t in range(last + 1):
            label = labels[record["id"], t]
            if t == last:
                assert label["completion_rate"] == float(record["success"])
                continue
            assert label["completion_rate"] == pytest.approx(readings[t + 1]["probability"], abs=1e-5)
            value = label["tokens_to_go"] if label["can_complete"] else label.get("tokens_to_go_if_completed")
            assert value == pytest.approx(tokens[t] + readings[t + 1]["tokens_to_go"], rel=1e-5)
            assert label["source"] == "td"
