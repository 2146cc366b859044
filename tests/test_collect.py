"""``deltattg collect`` pools diverse policies into one trajectory file in the core format."""

from __future__ import annotations

import pytest

from pathlib import Path

from conftest import skip_here
from deltattg.cli import main
from deltattg.data.sources import read_trajectories
from deltattg.rollout.collect import parse_policy


def test_household_pool(tmp_path, capsys):
    out = tmp_path / "pool.jsonl"
    args = ["collect", "--env", "household", "--short", "--policy", "expert", "--policy", "expert:0.5", "--policy",
            "random", "--episodes", "12", "--group-size", "3", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    items, skipped = read_trajectories(out)  # validates every record
    trajectories = [i.trajectory for i in items]
    assert skipped == 0 and len(trajectories) == 36
    by_policy = {p: [t for t in trajectories if t.policy == p] for p in ("expert-eps0", "expert-eps0.5", "random")}
    assert all(len(ts) == 12 for ts in by_policy.values())
    # Same tasks for every policy, G = 3 episodes per task.
    assert [t.group for t in by_policy["random"]] == [t.group for t in by_policy["expert-eps0"]]
    assert len({t.group for t in trajectories}) == 4
    assert all(t.success for t in by_policy["expert-eps0"])
    successes = {p: sum(t.success for t in ts) for p, ts in by_policy.items()}
    assert successes["expert-eps0"] >= successes["expert-eps0.5"] >= successes["random"]
    assert len({t.id for t in trajectories}) == 36
    assert "random: 12 episodes" in capsys.readouterr().err


def test_step_tokens_counted_with_a_tokenizer(tmp_path, tiny_tokenizer):
    out = tmp_path / "pool.jsonl"
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    assert main(["collect", "--env", "household", "--short", "--policy", "expert", "--episodes", "2", "--out", str(out),
                 "--tokenizer", str(tmp_path / "tok"), "--no-progress"]) == 0
    items, _ = read_trajectories(out)
    assert all(t.trajectory.step_tokens and len(t.trajectory.step_tokens) == t.trajectory.num_steps for t in items)


@pytest.mark.parametrize("spec", ["expert:2", "lm:", "greedy", "random:1"])
def test_bad_policy_specs(spec, tmp_path):
    with pytest.raises(ValueError):
        parse_policy(spec)
    with pytest.raises(SystemExit) as exc:
        main(["collect", "--env", "household", "--policy", spec, "--episodes", "1", "--out", str(tmp_path / "o.jsonl")])
    assert exc.value.code == 2 and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("target", ["/sys/deltattg-pool.jsonl", "/proc/deltattg-pool.jsonl"])
def test_an_unwritable_out_is_refused_before_any_episode(target, capsys):
    """(As root, chmod blocks nothing: /sys and /proc refuse new files to anyone.) The check comes first, not after
    the episodes: no progress bar is drawn."""
    if not Path(target).parent.is_dir():
        skip_here(f"no {Path(target).parent}")
    code = main(["collect", "--env", "household", "--short", "--policy", "expert", "--episodes", "2", "--out", target])
    err = capsys.readouterr().err
    assert code == 2 and f"{target}: cannot write" in err and "rollout" not in err and "Traceback" not in err


def test_noisy_expert_records_carry_provenance_step_labels(tmp_path, tiny_tokenizer, capsys):
    """+1 where the noisy expert took the expert's action, −1 where it made a deliberate mistake, as AgentProcessBench
    ``step_labels`` keyed by assistant message index; nothing for a policy without provenance (random). ``eval-steps``
    reads them: the planner (oracle meter) judges every expert step as progress."""
    import json

    out = tmp_path / "pool.jsonl"
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    assert main(["collect", "--env", "household", "--short", "--policy", "expert", "--policy", "expert:1",
                 "--policy", "expert:0.5", "--policy", "random", "--episodes", "6", "--group-size", "2",
                 "--out", str(out), "--no-progress"]) == 0
    by_policy: dict = {}
    for item in read_trajectories(out)[0]:
        by_policy.setdefault(item.trajectory.policy, []).append(item.trajectory)
    for policy, wanted in (("expert-eps0", {1}), ("expert-eps1", {-1}), ("expert-eps0.5", {1, -1})):
        labels = [t.extra["step_labels"] for t in by_policy[policy]]
        assert all(t.extra["data_source"] == "household" for t in by_policy[policy])
        assert all(sorted(map(int, lab)) == [2 + 2 * k for k in range(t.num_steps)]
                   for lab, t in zip(labels, by_policy[policy]))  # fmt: skip
        assert {v for lab in labels for v in lab.values()} == wanted, policy
    assert all("step_labels" not in t.extra for t in by_policy["random"])

    from deltattg.meter.loading import load_meter, read_states
    from deltattg.meter.step_quality import labelled_steps, step_judgements

    oracle = load_meter("oracle", tokenizer=str(tmp_path / "tok"))
    noisy = by_policy["expert-eps0.5"]
    for t, readings in zip(noisy, read_states(oracle, noisy, terminal=True)[0]):
        judged = step_judgements(readings, 256.0)
        for step, label in labelled_steps(t.messages, t.extra["step_labels"]).items():
            if label == 1:
                assert judged[step] == 1, (t.id, step)  # the planner's own action always shortens its plan
    report = tmp_path / "steps.json"
    assert main(["eval-steps", "--data", str(out), "--meter", "oracle", "--tokenizer", str(tmp_path / "tok"),
                 "--failure-cost", "256", "--json", str(report), "--no-progress"]) == 0
    rows = json.loads(report.read_text())["household"]
    steps = sum(len(t.extra["step_labels"]) for ts in by_policy.values() for t in ts if "step_labels" in t.extra)
    assert rows["meter (binary)"]["steps"] == steps
    assert rows["meter (binary)"]["correct"] >= rows["meter (binary)"]["beneficial"]


def test_more_episodes_than_tasks_is_refused_not_repeated(tmp_path, capsys):
    """``--episodes`` beyond the split's tasks used to draw tasks again and write repeated trajectory ids (which
    ``labels`` and ``credit`` then refuse): it is refused up front; a larger ``--group-size`` plays a task more often,
    each episode with its own id."""
    from deltattg.envs.household import HouseholdConfig

    tasks = HouseholdConfig.short().n_valid_seen
    out = tmp_path / "pool.jsonl"
    argv = ["collect", "--env", "household", "--short", "--split", "valid_seen", "--policy", "random", "--out",
            str(out), "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--episodes", str(tasks + 1)])
    assert exit_info.value.code == 2 and f"the split has only {tasks}" in capsys.readouterr().err
    assert not out.exists()
    assert main([*argv, "--episodes", str(tasks + 1), "--group-size", "2"]) == 0
    ids = [item.trajectory.id for item in read_trajectories(out)[0]]
    assert len(ids) == tasks + 1 == len(set(ids))
