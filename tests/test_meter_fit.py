"""Meter fit and agreement (``deltattg eval-meter``): the household oracle on noiseless expert trajectories reads the
labels exactly, and a flipped oracle disagrees with the plain one on every b̂ while ranking TTG the same."""

from __future__ import annotations

import json
import math

import pytest

from conftest import collect_household, save_household_tokenizer
from deltattg.cli import main
from deltattg.data.trajectory import MeterOutput, Trajectory
from deltattg.meter.fit import default_failure_cost, sibling_steps, step_change_agreement, step_changes
from deltattg.ranks import spearman


@pytest.mark.parametrize(
    ("a", "b", "rho"),
    [([1, 2, 3, 4], [10, 20, 30, 40], 1.0), ([1, 2, 3, 4], [4, 3, 2, 1], -1.0), ([1, 2, 2, 3], [1, 2, 2, 3], 1.0),
     ([1, 2, 3], [1, 3, 2], 0.5)],
)  # fmt: skip
def test_spearman_ranks_with_ties(a, b, rho):
    assert spearman(a, b) == pytest.approx(rho)


def test_spearman_is_undefined_for_constant_or_short_inputs():
    assert math.isnan(spearman([1, 2], [1, 2])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_eval_meter_on_expert_trajectories_and_against_a_reference(tmp_path, capsys):
    tokenizer = str(save_household_tokenizer(tmp_path / "tok"))
    pool = collect_household(tmp_path / "pool.jsonl", ["expert"], 12, "--tokenizer", tokenizer)
    out = tmp_path / "fit.json"
    assert main(["eval-meter", str(pool), "--meter", "oracle", "--tokenizer", tokenizer, "--json", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    fit = json.loads(out.read_text())
    assert fit["trajectories"] == 12 and fit["states"] > 50
    assert fit["completion_accuracy"] == 1.0 and fit["ttg_spearman"] == pytest.approx(1.0)
    assert fit["ttg_mean_absolute_error"] == 0.0
    assert "100.0% completion accuracy" in capsys.readouterr().out
    assert main(["eval-meter", str(pool), "--meter", "oracle", "--oracle-flip", "1", "--reference", "oracle",
                 "--tokenizer", tokenizer, "--json", str(out), "--no-progress"]) == 0  # fmt: skip
    flipped = json.loads(out.read_text())
    assert flipped["completion_accuracy"] == 0.0
    assert flipped["reference"]["completion_agreement"] == 0.0 and flipped["reference"]["states"] == fit["states"]
    assert flipped["reference"]["ttg_spearman"] == pytest.approx(1.0)
    # every b̂ flipped: Δ no longer follows the planner's, although v̂ ranks exactly as its v
    assert flipped["reference"]["steps"] == fit["states"] and flipped["reference"]["delta_spearman"] < 0.5
    assert main(["eval-meter", str(pool), "--meter", "oracle", "--reference", "oracle", "--tokenizer", tokenizer,
                 "--json", str(out), "--no-progress"]) == 0  # fmt: skip
    itself = json.loads(out.read_text())["reference"]
    assert itself["delta_spearman"] == pytest.approx(1.0) and itself["delta_sign_agreement"] == 1.0
    confusion = itself["delta_sign_confusion"]  # every step on the diagonal, an expert's mostly progress
    assert sum(n for row in confusion.values() for n in row.values()) == itself["steps"]
    assert all(n == 0 for kind, row in confusion.items() for other, n in row.items() if other != kind)
    assert confusion["progress"]["progress"] > 0
    printed = capsys.readouterr().out
    assert "step changes Δ (C = " in printed and "read by oracle as progress / none / regress: progress (" in printed


def reading(v: float | None, can: bool = True) -> MeterOutput:
    return MeterOutput(can_complete=can, tokens_to_go=v)


def test_step_changes_follow_eq_7_and_8_with_the_terminal_anchored():
    """c = min(v̂, C) where b̂, else C; Δ_t = c_t − c_{t+1}; c_T = 0 on success, C on failure; None where unread."""
    row = [reading(30.0), reading(500.0), reading(5.0, can=False), None, reading(10.0)]
    assert step_changes(True, row, 100.0) == [30 - 100, 0.0, None, None, 10.0]
    assert step_changes(False, row[:2], 100.0) == [-70.0, 0.0]
    assert step_changes(True, [], 100.0) == []


def test_the_sign_confusion_counts_each_reference_kind_by_the_meters_kind():
    """Rows: the reference's kind of step (its Δ's sign); columns: ours. A meter that reads a no-op step as a little
    progress and a regress as none lands off the diagonal there."""
    trajectories = sibling_trajectories([["a", "b", "c"]], [True])
    reference = [[reading(40.0), reading(40.0), reading(50.0)]]  # Δ: 0 (none), −10 (regress), +50 (terminal)
    ours = [[reading(40.0), reading(38.0), reading(38.0)]]  # Δ: +2 (progress), 0 (none), +38 (progress)
    changes = step_change_agreement(trajectories, ours, reference, 100.0)
    assert changes.sign_confusion == {"progress": {"progress": 1, "none": 0, "regress": 0},
                                      "none": {"progress": 1, "none": 0, "regress": 0},
                                      "regress": {"progress": 0, "none": 1, "regress": 0}}  # fmt: skip
    assert changes.delta_sign_agreement == pytest.approx(1 / 3)


def sibling_trajectories(actions: list[list[str]], success: list[bool]) -> list[Trajectory]:
    out = []
    for k, (steps, won) in enumerate(zip(actions, success)):
        messages = [{"role": "user", "content": "task"}]
        for a in steps:
            messages += [{"role": "assistant", "content": a}, {"role": "user", "content": f"after {a}"}]
        out.append(Trajectory(id=f"t{k}", group="g", reward=float(won), success=won, messages=messages))
    return out


def test_sibling_ranking_orders_the_actions_taken_from_one_state():
    """Three trajectories share h_0; two share h_1 too. A meter that ranks the siblings' next states as the reference
    does scores 1, one that ranks them backwards 0, one that cannot tell them apart ½."""
    trajectories = sibling_trajectories([["a", "x"], ["a", "y"], ["b", "z"]], [True, False, False])
    assert len(sibling_steps(trajectories)) == 3  # (0,1) differ at t=1 only; (0,2) and (1,2) at t=0
    reference = [[reading(40.0), reading(20.0)], [reading(40.0), reading(20.0)], [reading(40.0), reading(60.0)]]
    backwards = [[reading(40.0), reading(60.0)], [reading(40.0), reading(60.0)], [reading(40.0), reading(20.0)]]
    blind = [[reading(40.0), reading(30.0)]] * 3
    assert step_change_agreement(trajectories, reference, reference, 100.0).sibling_ranking == 1.0
    agreement = step_change_agreement(trajectories, backwards, reference, 100.0)
    # the t=1 pair's order comes from the terminal anchor (success 0, failure C): all meters agree on it
    assert agreement.sibling_pairs == 3 and agreement.sibling_ranking == pytest.approx(1 / 3)
    assert step_change_agreement(trajectories, blind, reference, 100.0).sibling_ranking == pytest.approx(2 / 3)


def test_the_default_failure_cost_lies_above_every_token_to_go():
    trajectories = sibling_trajectories([["a"], ["b"]], [True, False])
    trajectories[0].step_tokens = [70]
    assert default_failure_cost(trajectories, [[reading(40.0)], [reading(90.0, can=False)]]) == 256.0
    assert default_failure_cost(trajectories, [[reading(300.0)], [None]]) == 1024.0


def test_failure_cost_needs_a_reference(tmp_path, capsys):
    tokenizer = str(save_household_tokenizer(tmp_path / "tok"))
    pool = collect_household(tmp_path / "pool.jsonl", ["expert"], 2, "--tokenizer", tokenizer)
    with pytest.raises(SystemExit) as exc:
        main(["eval-meter", str(pool), "--meter", "oracle", "--tokenizer", tokenizer, "--failure-cost", "64"])
    assert exc.value.code == 2 and "give a --reference" in capsys.readouterr().err


def test_eval_meter_refuses_records_without_token_counts(tmp_path, capsys):
    pool = collect_household(tmp_path / "pool.jsonl", ["expert"], 2)
    records = [json.loads(line) for line in pool.read_text().splitlines()]
    for record in records:
        record.pop("step_tokens", None)
    pool.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["eval-meter", str(pool), "--meter", "oracle", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert f"{pool}:1" in error and "step_tokens" in error and "--tokenizer" in error


def test_temperature_scaling_recovers_a_known_temperature():
    """Outcomes drawn with P(success) = σ(z / 2): the fitted temperature is 2 (to sampling error), the ECE of
    σ(z / T) is small, and a single outcome leaves T = 1."""
    import numpy as np

    from deltattg.meter.fit import expected_calibration_error, fit_temperature

    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, 20_000)
    y = rng.random(20_000) < 1 / (1 + np.exp(-z / 2))
    t = fit_temperature(z.tolist(), y.tolist())
    assert t == pytest.approx(2.0, rel=0.05)
    assert expected_calibration_error(1 / (1 + np.exp(-z / t)), y) < 0.02
    assert expected_calibration_error(1 / (1 + np.exp(-z)), y) > 0.05  # uncalibrated: overconfident
    assert fit_temperature([1.0, 2.0], [True, True]) == 1.0
    # ECE by hand: bins [0.0, 0.1) holds p 0.05 with outcome 0, [0.9, 1.0] holds 0.95 and 0.95 with outcomes 1, 0:
    # |0 − 0.05|·1/3 + |0.5 − 0.95|·2/3 = 0.3167.
    assert expected_calibration_error([0.05, 0.95, 0.95], [False, True, False]) == pytest.approx(0.31667, abs=1e-4)


def test_reliability_bins_by_hand():
    """Each non-empty bin's bounds, states, mean p̃ and outcome rate; p̃ = 1 falls in the last bin."""
    from deltattg.meter.fit import reliability_bins

    points = reliability_bins([0.05, 0.95, 1.0, 0.42], [False, True, False, True], bins=10)
    assert [(b["lower"], b["upper"], b["states"]) for b in points] == [(0.0, 0.1, 1), (0.4, 0.5, 1), (0.9, 1.0, 2)]
    assert [b["mean_probability"] for b in points] == pytest.approx([0.05, 0.42, 0.975])
    assert [b["outcome_rate"] for b in points] == [0.0, 1.0, 0.5]
    assert reliability_bins([], []) == []


def test_the_cross_fitted_ece_reads_states_the_temperature_never_saw():
    """Trajectories whose logits carry no information (outcomes coin flips): the temperature fitted on them flattens
    p̃ toward their own base rate, so ECE on the fitting states looks better than it is; the cross-fitted ECE reads
    each half with the other half's temperature (and is NaN with a single trajectory)."""
    import numpy as np

    from deltattg.meter.fit import cross_fitted_ece, expected_calibration_error

    rng = np.random.default_rng(3)
    trajectories = [[(float(z), bool(rng.random() < 0.5)) for z in rng.normal(0, 1, 5)] for _ in range(40)]
    unseen = cross_fitted_ece(trajectories)
    halves = [[p for rows in trajectories[k::2] for p in rows] for k in (0, 1)]
    assert 0 <= unseen <= 1 and unseen == pytest.approx(np.average(
        [expected_calibration_error(*_calibrated(halves[1 - k], halves[k])) for k in (0, 1)],
        weights=[len(halves[1]), len(halves[0])]))  # fmt: skip
    assert np.isnan(cross_fitted_ece(trajectories[:1]))


def _calibrated(read_on, fit_on):
    """(p̃ of ``read_on`` under the temperature fitted on ``fit_on``, its outcomes)."""
    from deltattg.data.trajectory import calibrated_probability
    from deltattg.meter.fit import fit_temperature

    t = fit_temperature([z for z, _ in fit_on], [y for _, y in fit_on])
    return [calibrated_probability(z, t) for z, _ in read_on], [y for _, y in read_on]
