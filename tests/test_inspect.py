"""``deltattg inspect``: step classes and credit precision by hand, then the command on household rollouts scored by
the oracle (no learned model anywhere, so every number is fixed by the seeds)."""

from __future__ import annotations

import json
import math

import pytest

from conftest import collect_household, save_household_tokenizer
from deltattg.cli import main
from deltattg.inspection import credit_concentration, credit_precision, shown_trajectories, step_classes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_step_classes_by_hand():
    # d: 5 → 4 progress, 4 → 4 neutral, 4 → 6 regress, 6 → 0 progress
    assert step_classes([5, 4, 4, 6, 0]) == ["progress", "neutral", "regress", "progress"]


def test_credit_precision_by_hand():
    # A > 0: credit 2, 0.5, 0.5 on 1, 2, 2 tokens -> mass 2 + 1 + 1 = 4, on progress steps 2 + 1 = 3 -> 75 %.
    # A < 0: credit -1, -3 on 2, 1 tokens -> mass 2 + 3 = 5, on the regress step 3 -> 60 %. A = 0 is ignored.
    records = [
        {"advantage": 1.0, "step_advantages": [2.0, 0.5, 0.5], "step_tokens": [1, 2, 2]},
        {"advantage": -2.0, "step_advantages": [-1.0, -3.0], "step_tokens": [2, 1]},
        {"advantage": 0.0, "step_advantages": [0.0], "step_tokens": [9]},
    ]
    classes = [["progress", "neutral", "progress"], ["progress", "regress"], ["neutral"]]
    p = credit_precision(records, classes)
    assert (p.positive_on_progress, p.negative_off_progress) == (pytest.approx(0.75), pytest.approx(0.6))
    assert (p.positive_trajectories, p.negative_trajectories) == (1, 1)
    assert math.isnan(credit_precision(records[2:], classes[2:]).positive_on_progress)  # no positive credit at all


def test_additive_credit_counts_each_step_by_its_own_sign():
    # GiGPO-style: an A > 0 trajectory whose regress step got -1 (1 token) and progress step +3 (2 tokens):
    # positive mass 6, all on progress -> 100 %; negative mass 1, on the regress step -> 100 %.
    records = [{"advantage": 0.5, "step_advantages": [3.0, -1.0], "step_tokens": [2, 1]}]
    p = credit_precision(records, [["progress", "regress"]])
    assert (p.positive_on_progress, p.negative_off_progress) == (pytest.approx(1.0), pytest.approx(1.0))
    assert (p.positive_trajectories, p.negative_trajectories) == (1, 0)


def test_shown_trajectories_alternate_outcomes_of_a_mixed_group():
    records = [{"group": "a", "success": True, "step_advantages": [1]},
               {"group": "b", "success": True, "step_advantages": [1, 1]},
               {"group": "b", "success": False, "step_advantages": [1, 1, 1]},
               {"group": "b", "success": True, "step_advantages": [1, 1, 1, 1]}]  # fmt: skip
    assert shown_trajectories(records, 3) == [3, 2, 1]
    assert shown_trajectories(records, 5) == [3, 2, 1, 0]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """Noisy-expert household groups scored by the exact oracle and by a degraded one."""
    folder = tmp_path_factory.mktemp("inspect")
    save_household_tokenizer(folder / "tok")
    pool = collect_household(folder / "pool.jsonl", ["expert:0.3", "expert:0.6"], 48, "--group-size", "8",
                             "--max-turns", "12")  # fmt: skip
    for name, dials in (("oracle", []), ("noisy", ["--oracle-noise", "0.5", "--oracle-flip", "0.1"])):
        assert main(["score", str(pool), "--meter", "oracle", "--tokenizer", str(folder / "tok"), "--no-progress",
                     "--out", str(folder / f"{name}.jsonl"), *dials]) == 0  # fmt: skip
    return folder


def test_inspect_writes_the_precision_table_and_picture(scored, capsys):
    out = scored / "report"
    assert main(["inspect", str(scored / "oracle.jsonl"), str(scored / "noisy.jsonl"), "--methods", "grpo,deltattg",
                 "--failure-cost", "256", "--env", "household", "--tokenizer", str(scored / "tok"),
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    figures = json.loads((out / "inspect.json").read_text())
    precision = figures["precision"]
    assert list(precision) == ["grpo", "deltattg [oracle]", "deltattg [noisy]"]
    grpo, exact, noisy = (precision[k]["positive_on_progress"] for k in precision)
    # The oracle's credit lands on progress (the goal: >= 80 %) far above GRPO's token share; a degraded
    # oracle sits in between.
    assert exact >= 0.8 and exact > noisy > grpo
    assert precision["deltattg [oracle]"]["negative_off_progress"] > precision["grpo"]["negative_off_progress"]
    records = [json.loads(line) for line in (scored / "oracle.jsonl").read_text().splitlines()]
    assert sum(figures["census"].values()) == sum(len(r["meter"]) for r in records)  # one reading per step
    assert "| deltattg [oracle] | deltattg |" in (out / "inspect.md").read_text() and "| grpo | grpo |" in printed
    assert (out / "inspect.png").read_bytes()[:8] == PNG_SIGNATURE
    shown = figures["shown"][0]["steps"]
    assert {"action", "class", "distance", "credit"} <= set(shown[0]) and set(shown[0]["credit"]) == set(precision)


def test_credit_concentration_by_hand():
    # Shares |Ã|·n / Σ: (1·1, 1·3) -> 0.25, 0.75 (GRPO's own token shares: nothing moved); (2·1, 0.5·1) -> 0.8, 0.2
    # against token shares 0.5, 0.5 (moved ½·(0.3 + 0.3) = 0.3). A = 0 trajectories get no credit and are left out.
    records = [{"step_advantages": [1.0, 1.0], "step_tokens": [1, 3]},
               {"step_advantages": [-2.0, -0.5], "step_tokens": [1, 1]},
               {"step_advantages": [0.0, 0.0], "step_tokens": [4, 4]}]  # fmt: skip
    c = credit_concentration(records)
    assert (c.largest_share_mean, c.largest_share_p90, c.trajectories) == (pytest.approx(0.775), pytest.approx(0.795), 2)
    entropy = lambda ps: -sum(p * math.log(p) for p in ps)  # noqa: E731
    assert c.share_entropy == pytest.approx((entropy([0.25, 0.75]) + entropy([0.8, 0.2])) / 2)
    assert c.redistributed == pytest.approx(0.15)


def test_the_recommended_configuration_spreads_a_noisy_meters_credit(scored):
    """The issue's check on noisy-expert groups read by the σ 0.5 / flip 0.1 oracle: the recommended estimator's
    largest step share is <= 0.30 on average and below the paper's, and its positive credit on progress steps is
    at least GRPO's."""
    out = scored / "robust"
    assert main(["inspect", str(scored / "noisy.jsonl"), "--methods", "grpo,deltattg,deltattg_robust",
                 "--failure-cost", "256", "--env", "household", "--tokenizer", str(scored / "tok"),
                 "--out", str(out)]) == 0  # fmt: skip
    figures = json.loads((out / "inspect.json").read_text())
    share = {arm: c["largest_share_mean"] for arm, c in figures["concentration"].items()}
    assert set(figures["concentration"]["deltattg_robust"]) >= {"largest_share_mean", "largest_share_p90",
                                                                 "share_entropy"}
    assert share["deltattg_robust"] <= 0.30 < share["deltattg"]
    precision = figures["precision"]
    assert precision["deltattg_robust"]["positive_on_progress"] >= precision["grpo"]["positive_on_progress"]
    assert figures["concentration"]["grpo"]["redistributed"] == 0.0


def test_inspect_refuses_inputs_that_differ_and_unknown_methods(scored, tmp_path, capsys):
    lines = (scored / "oracle.jsonl").read_text().splitlines()
    (tmp_path / "short.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    code = main(["inspect", str(scored / "oracle.jsonl"), str(tmp_path / "short.jsonl"), "--methods", "deltattg",
                 "--failure-cost", "256", "--tokenizer", str(scored / "tok"), "--out", str(tmp_path / "r")])  # fmt: skip
    assert code == 2 and "same trajectories" in capsys.readouterr().err and not (tmp_path / "r").exists()
    for methods, message in (("grpo,nope", "unknown"), ("deltattg", "--failure-cost")):
        with pytest.raises(SystemExit) as exit_info:
            main(["inspect", str(scored / "oracle.jsonl"), "--methods", methods, "--out", str(tmp_path / "r")])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
