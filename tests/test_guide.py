"""`deltattg guide`: test-time action selection (E.5) as a command — a noisy expert guided by the oracle meter beats
its natural and random-of-K arms on household (no learned model needed), and bad options exit 2 with no output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import save_household_tokenizer, skip_here
from deltattg.cli import main
from deltattg.guidance import GuidedPolicy, compare_guidance
from deltattg.envs.registry import env_factory
from deltattg.meter.oracle import OracleMeter
from deltattg.rollout.policies import NoisyExpertPolicy

# ε = 0.7 on 30 short tasks: natural ≈ 57 %, random-of-4 ≈ 57 %, oracle-of-4 = 100 % (seed 0; seeds 1-3 give
# natural 37-50 %, random 33-53 %, oracle 100 %): a margin of ~40 points, far above chance.
GUIDE = ["guide", "--env", "household", "--short", "--actor", "expert:0.7", "--meter", "oracle", "--candidates", "4",
         "--episodes", "30", "--seed", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return save_household_tokenizer(tmp_path_factory.mktemp("guide") / "tok")


def test_oracle_guided_noisy_expert_beats_natural_and_random(tokenizer, tmp_path, capsys):
    out = tmp_path / "guide.json"
    assert main([*GUIDE, "--tokenizer", str(tokenizer), "--json", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    for arm in ("expert-eps0.7", "expert-eps0.7+random-of-4", "expert-eps0.7+meter-of-4"):  # a progress bar per arm
        assert f"rollout {arm}: 100%" in captured.err
    assert "natural rollout (1) SR %" in printed and "progress meter (4) SR %" in printed and "meter:" in printed
    report = json.loads(out.read_text())
    natural, random_k, meter_k = report["arms"]
    assert [a["name"] for a in report["arms"]] == ["natural rollout", "random selection", "progress meter"]
    assert [a["candidates"] for a in report["arms"]] == [1, 4, 4]
    assert report["episodes"] == len(report["tasks"]) == 30
    assert meter_k["success"] >= natural["success"] + 0.25 and meter_k["success"] >= random_k["success"] + 0.25
    assert meter_k["steps"] < natural["steps"] and meter_k["steps"] < random_k["steps"]
    assert 0.0 < report["meter_share"] <= 1.0 and report["meter_seconds"] > 0.0
    # deterministic: the same seed gives the same numbers
    again = tmp_path / "again.json"
    assert main([*GUIDE, "--tokenizer", str(tokenizer), "--json", str(again), "--no-progress"]) == 0
    assert "rollout" not in capsys.readouterr().err
    rerun = json.loads(again.read_text())
    assert [(a["success"], a["steps"]) for a in rerun["arms"]] == [(a["success"], a["steps"]) for a in report["arms"]]


def test_the_json_records_the_environment_options_it_played(tokenizer, tmp_path):
    """--env-option knobs shape the tasks, so the report names them (null when none were given)."""
    plain, knob = tmp_path / "plain.json", tmp_path / "knob.json"
    base = [*GUIDE[:-4], "--episodes", "2", "--seed", "0", "--tokenizer", str(tokenizer), "--no-progress"]
    assert main([*base, "--json", str(plain)]) == 0
    assert main([*base, "--env-option", "max_steps=9", "--json", str(knob)]) == 0
    assert json.loads(plain.read_text())["env_options"] is None
    assert json.loads(knob.read_text())["env_options"] == {"max_steps": 9}


def test_oracle_reads_each_branch_as_a_record(tokenizer):
    """The library call: with K = 1 the guided arms take the actor's only proposal, so all three arms agree."""
    from deltattg.hf import load_tokenizer

    make_env = env_factory("household", size="short")
    tasks = make_env().tasks("train")[:5]
    result = compare_guidance(make_env, tasks, lambda: NoisyExpertPolicy(0.5, seed=3),
                              OracleMeter(load_tokenizer(str(tokenizer))), candidates=1, seed=3)  # fmt: skip
    assert len({(r.success, r.steps) for r in result.rows}) == 1
    with pytest.raises(ValueError):
        compare_guidance(make_env, tasks, lambda: NoisyExpertPolicy(0.5), None, candidates=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GuidedPolicy(NoisyExpertPolicy(0.5), None, select="meter")


@pytest.mark.parametrize("change", [
    {"--candidates": "0"},
    {"--candidates": "-1"},
    {"--env": "nowhere"},
    {"--tokenizer": None},  # --meter oracle without --tokenizer
    {"--actor": "expret:0.5"},
    {"--episodes": "0"},
    {"--env": "bfcl", "--short": None},  # --meter oracle off household
])
def test_bad_options_exit_2_and_write_nothing(change, tokenizer, tmp_path, capsys):
    argv = ["guide"]
    options = {"--env": "household", "--short": True, "--actor": "expert:0.7", "--meter": "oracle", "--candidates": "4",
               "--episodes": "3", "--tokenizer": str(tokenizer)}  # fmt: skip
    options.update(change)
    for name, value in options.items():
        if value is True:
            argv.append(name)
        elif value is not None:
            argv += [name, value]
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exit_info:
        code = main([*argv, "--json", str(out)])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == ""


def test_more_episodes_than_tasks_is_refused_as_evaluate_refuses_it(tokenizer, tmp_path, capsys):
    """Each task is played once: 51 episodes of the 50 short valid_unseen tasks exit 2 with `evaluate`'s message
    (they used to play 36 distinct tasks, some three times, and report 51 tasks); 50 play every task once."""
    argv = ["guide", "--env", "household", "--short", "--split", "valid_unseen", "--actor", "expert", "--meter",
            "oracle", "--candidates", "1", "--tokenizer", str(tokenizer), "--max-turns", "1"]  # fmt: skip
    out = tmp_path / "guide.json"
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--episodes", "51", "--json", str(out)])
    assert exit_info.value.code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "--episodes 51: the split has only 50 tasks (each is played once)" in err and "rollout" not in err
    assert main([*argv, "--episodes", "50", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["episodes"] == len(set(report["tasks"])) == 50


@pytest.mark.parametrize("target", ["/sys/deltattg-guide.json", "/proc/deltattg-guide.json"])
def test_an_unwritable_json_is_refused_before_any_episode(target, tokenizer, capsys):
    if not Path(target).parent.is_dir():
        skip_here(f"no {Path(target).parent}")
    code = main([*GUIDE[:-4], "--tokenizer", str(tokenizer), "--episodes", "2", "--json", target])  # bars shown
    assert code == 2
    err = capsys.readouterr().err
    assert f"{target}: cannot write" in err and "rollout" not in err and "Traceback" not in err


class AvoidingMeter:
    """A scripted meter: a history whose last observation names ``avoid`` cannot be completed (cost C); otherwise the
    remaining work is read as the length of that observation."""

    meter_id = "avoiding"

    def __init__(self, avoid: str):
        self.avoid = avoid

    def score(self, histories):
        from deltattg.data.trajectory import MeterOutput

        return [MeterOutput(can_complete=self.avoid not in h[-1]["content"],
                            tokens_to_go=float(len(h[-1]["content"]))) for h in histories]  # fmt: skip


class Proposals:
    """An actor that proposes, for every episode, a wrong call first, then the environment's expert action."""

    name = "proposals"

    def __init__(self, wrong: str):
        self.wrong = wrong

    def act(self, episodes):
        from deltattg.rollout.engine import Action

        return [Action(self.wrong) if k % 2 == 0 else Action(e.env.expert_action()) for k, e in enumerate(episodes)]


def test_guidance_on_bfcl_tries_candidates_in_replayed_branches():
    """BFCL cannot snapshot: each candidate runs in a replay of the episode and the main environment only ever runs
    the chosen action. The rejected candidate creates a folder at every step; had one leaked into the main
    environment, BFCL's checker would fail the episode on the stray folder."""
    pytest.importorskip("bfcl_eval")
    from deltattg.rollout.engine import run_episodes

    make_env = env_factory("bfcl")
    task = make_env().tasks("base")[0]
    guided = GuidedPolicy(Proposals("[mkdir(dir_name='stray')]"), AvoidingMeter("stray"), candidates=2,
                          make_env=make_env)  # fmt: skip
    [trajectory] = run_episodes(make_env, [task], guided, max_turns=40)
    assert trajectory.success
    assert all("stray" not in m["content"] for m in trajectory.messages if m["role"] == "assistant")
    assert guided.meter_seconds > 0.0
    # the same candidate chosen instead fails the checker: the test would see a leak
    env = make_env()
    env.reset(task)
    env.step("[mkdir(dir_name='stray')]")
    while not (result := env.step(env.expert_action())).done:
        pass
    assert not result.won
