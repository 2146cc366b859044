"""The belief reference (envs.household.belief, meter.belief): its prior is the task generator's, it reads no more than
the history shows, and it is the planner wherever the history leaves nothing hidden."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence

import pytest

from deltattg.data.trajectory import Trajectory, parse_trajectory
from deltattg.envs.household.belief import belief_readings, hypotheses, sampled_hypotheses
from deltattg.envs.household.env import HouseholdEnv
from deltattg.envs.household.generation import HouseholdConfig, _layout, generate, split_tasks
from deltattg.envs.household.planner import optimal_remaining
from deltattg.envs.household.world import is_won
from deltattg.hf import load_tokenizer
from deltattg.meter.belief import BeliefMeter
from deltattg.meter.oracle import OracleMeter
from deltattg.regime.config import HOUSEHOLD_OPTIONS
from deltattg.rollout.collect import collect, parse_policy
from deltattg.rollout.engine import Action, Episode, run_episodes
from deltattg.train import env_factory
from deltattg.train.config import EnvConfig
from deltattg.envs.replay import recorded_episode

MAX_TURNS = 12


def regime_env() -> HouseholdEnv:
    return env_factory(EnvConfig(name="household", size="short", options=dict(HOUSEHOLD_OPTIONS)), MAX_TURNS)()


def regime_config() -> HouseholdConfig:
    return regime_env().config


@pytest.fixture(scope="module")
def make_env():
    return env_factory(EnvConfig(name="household", size="short", options=dict(HOUSEHOLD_OPTIONS)), MAX_TURNS)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


def hidden(world, start) -> tuple:
    return world.objects, start.where, world.lamp_at


def test_the_enumerated_prior_is_the_generators_conditioned_on_what_the_first_observation_shows():
    """Draw houses as the generator does (receptacles, objects, lamp, places; redrawn unless accepted) and keep those
    that show the same goal and receptacles: their hidden parts are distributed as the enumeration says."""
    config = regime_config()
    world, _ = generate(config, 1_000_087)
    found, sampled = hypotheses(config, world)
    assert not sampled and len(found) > 10
    prior = Counter()
    for h in found:
        prior[hidden(h.world, h.start)] += h.prior
    rng, seen = random.Random(0), Counter()
    low, high = config.plan_length
    while sum(seen.values()) < 4000:
        drawn, start = _layout(config, world.goal, 0, rng)
        if drawn.receptacles == world.receptacles and not is_won(drawn, start) and \
                low <= optimal_remaining(drawn, start) <= high:
            seen[hidden(drawn, start)] += 1
    assert set(seen) <= set(prior)  # every accepted draw is a hypothesis
    assert fits(seen, prior)


def fits(seen: Counter, prior: Counter) -> bool:
    """Pearson's χ² of the counts against the prior lies within 5 standard deviations of its mean (its degrees of
    freedom): a prior off by a factor anywhere that matters lands far outside (a uniform one: 14 times the mean)."""
    total = sum(seen.values())
    chi2 = sum((seen[k] - total * p) ** 2 / (total * p) for k, p in prior.items())
    df = len(prior) - 1
    return chi2 < df + 5 * (2 * df) ** 0.5


def test_sampled_hypotheses_follow_the_same_prior():
    config = regime_config()
    world, _ = generate(config, 1_000_087)
    found, _ = hypotheses(config, world)
    draws = sampled_hypotheses(config, world, 4000, random.Random(1))
    assert len(draws) == 4000 and all(h.prior == 1 / 4000 for h in draws)
    prior, seen = Counter(), Counter(hidden(h.world, h.start) for h in draws)
    for h in found:
        prior[hidden(h.world, h.start)] += h.prior
    assert fits(seen, prior)


class VisitAllThenExpert:
    """Goes to every receptacle in turn (seeing everything: the regime's receptacles start open), then the expert."""

    name = "visit-all"

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        out = []
        for e in episodes:
            world = e.env.world
            if len(e.history) < len(world.receptacles):
                out.append(Action(f"go to {world.receptacles[len(e.history)]}"))
            else:
                out.append(Action(e.env.expert_action() or "look"))
        return out


def test_where_the_history_leaves_one_world_the_belief_is_the_planner(make_env, tokenizer):
    env = make_env()
    tasks = list(env.tasks("valid_seen"))[:12]
    trajectories = run_episodes(make_env, tasks, VisitAllThenExpert(), max_turns=MAX_TURNS)
    belief, oracle = BeliefMeter(tokenizer), OracleMeter(tokenizer)
    compared = 0
    for trajectory in trajectories:
        env = make_env()
        env.reset(trajectory_task(trajectory, tasks))
        config, world = env.config, env.world
        found, _ = hypotheses(config, world)
        recorded = recorded_episode(trajectory, lambda: env, env.max_steps)
        rows = belief_readings(found, recorded.commands, recorded.observations[1:], trajectory.success, MAX_TURNS,
                               belief._task(config, world)[1], trajectory.num_steps)  # fmt: skip
        ours, exact = belief.read_trajectory(trajectory), oracle.read_trajectory(trajectory)
        for t, (row, mine, planner) in enumerate(zip(rows, ours, exact)):
            # Every receptacle seen: what is left hidden (where the lamp stands) does not matter to these tasks.
            if row.worlds == 1 or t >= len(world.receptacles):
                assert mine.can_complete == planner.can_complete and mine.probability in (0.0, 1.0)
                assert mine.tokens_to_go == pytest.approx(planner.tokens_to_go, rel=1e-12)
                compared += 1
    assert compared >= 12 * 3


def trajectory_task(trajectory: Trajectory, tasks):
    return next(t for t in tasks if t.id == trajectory.group)


def test_two_houses_that_look_alike_read_alike_until_the_history_tells_them_apart(make_env, tokenizer):
    """The first state of two tasks with the same goal and receptacles but other hidden objects reads the same: the
    belief does not see what the oracle sees."""
    config = make_env().config
    by_visible: dict[tuple, list] = {}
    for task in split_tasks(config, "train")[:400]:
        world, start = generate(config, int(task.data["seed"]))
        by_visible.setdefault((world.goal, world.receptacles), []).append((task, optimal_remaining(world, start)))
    pair = next([a, b] for group in by_visible.values() for a in group for b in group if a[1] != b[1])
    trajectories = run_episodes(make_env, [task for task, _ in pair], _Look(), max_turns=MAX_TURNS)
    belief, oracle = BeliefMeter(tokenizer), OracleMeter(tokenizer)
    first = [belief.read_trajectory(t)[0] for t in trajectories]
    assert first[0] == first[1]
    assert 0 < first[0].probability <= 1
    planner = [oracle.read_trajectory(t)[0] for t in trajectories]
    assert planner[0].tokens_to_go != planner[1].tokens_to_go  # the oracle reads the hidden difference


class _Look:
    name = "look"

    def act(self, episodes):
        return [Action("look") for _ in episodes]


@pytest.fixture(scope="module")
def pool(make_env, tmp_path_factory):
    specs = [parse_policy(p) for p in ("expert:0.1", "expert:0.5", "random")]
    trajectories = collect(make_env, "valid_seen", specs, episodes=12, group_size=2, seed=3, max_turns=MAX_TURNS,
                           progress=False)  # fmt: skip
    path = tmp_path_factory.mktemp("belief") / "pool.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories))
    return path


def test_eval_meter_reads_the_belief_against_the_oracle(pool, tmp_path):
    out = tmp_path / "belief.json"
    run = subprocess.run([sys.executable, "-m", "deltattg", "eval-meter", str(pool), "--meter", "belief",
                          "--reference", "oracle", "--tokenizer", "smollm2", "--json", str(out), "--no-progress"],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    reference = json.loads(out.read_text())["reference"]
    assert reference["meter"] == "oracle" and reference["states"] > 100
    assert reference["b_balanced_accuracy"] >= 0.95 and reference["ttg_spearman"] >= 0.95


def test_a_sampled_belief_says_so_and_still_reads(make_env, tokenizer, pool):
    trajectories = [parse_trajectory(json.loads(line)) for line in pool.read_text().splitlines()[:6]]
    meter = BeliefMeter(tokenizer, max_worlds=1, samples=512)
    rows = meter.score_records(trajectories)
    assert meter.sampled_tasks >= 1 and "samples=512" in meter.meter_id
    readings = [r for row in rows for r in row]
    assert sum(r is not None for r in readings) >= 0.9 * len(readings)


def test_the_belief_meter_needs_a_tokenizer_and_a_household_record(pool, tmp_path):
    run = subprocess.run([sys.executable, "-m", "deltattg", "score", str(pool), "--meter", "belief", "--out",
                          str(tmp_path / "scored.jsonl")], capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and "--meter belief counts Token-to-Go with --tokenizer" in run.stderr
    record = json.loads(pool.read_text().splitlines()[0])
    record["env"]["name"] = "alfworld"
    bad = tmp_path / "other.jsonl"
    bad.write_text(json.dumps(record) + "\n")
    run = subprocess.run([sys.executable, "-m", "deltattg", "score", str(bad), "--meter", "belief", "--tokenizer",
                          "smollm2", "--out", str(tmp_path / "scored.jsonl")], capture_output=True, text=True)
    assert run.returncode == 2 and f"{bad}:1" in run.stderr and "env.name" in run.stderr
    assert not (tmp_path / "scored.jsonl").exists()
