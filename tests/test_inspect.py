"""``deltattg inspect``: step classes and credit precision by hand, then the command on household rollouts scored by
the oracle (no learned model anywhere, so every number is fixed by the seeds)."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import collect_household, save_household_tokenizer
from deltattg.cli import main
from deltattg.credit import CreditConfig
from deltattg.data.jsonl import loads_strict
from deltattg.data.sources import read_trajectory_file
from deltattg.report import markdown_cell
from deltattg.inspection import (
    CreditArm,
    credit_concentration,
    credit_precision,
    input_labels,
    inspect_credit,
    shown_trajectories,
    step_classes,
)

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


# ---- issue 21: hostile inputs ----------------------------------------------------------------------------------------
def scored_record(index: int, reward: float, actions: list) -> dict:
    """A scored trajectory of ``actions`` (assistant contents: text or OpenAI parts), one reading per state."""
    messages = [{"role": "user", "content": "task"}]
    for t, action in enumerate(actions):
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": f"seen {t}"}]
    meter = [{"can_complete": True, "tokens_to_go": 10 - t, "logit": 0.5, "score": 0.2, "probability": 0.6}
             for t in range(len(actions))]  # fmt: skip
    return {"id": f"t{index}", "group": "g", "reward": reward, "success": reward > 0, "messages": messages,
            "step_tokens": [3] * len(actions), "meter": meter, "answer_logprobs": [-1.0] * (len(actions) + 1)}


HOSTILE = [scored_record(0, 1.0, [[{"type": "text", "text": "open "}, {"type": "text", "text": "door"}], "a | b"]),
           scored_record(1, 0.0, ["line one\nline two", "x\\|y", "look"]),
           scored_record(2, 1.0, ["go"])]  # fmt: skip


def write_records(path, records) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def inspect_argv(inputs, out, methods="grpo,deltattg") -> list[str]:
    return ["inspect", *map(str, inputs), "--methods", methods, "--failure-cost", "100", "--out", str(out)]


def test_inputs_with_the_same_name_get_labels_from_their_folders(tmp_path, capsys):
    # Arms were keyed by the file's stem: b/scored.jsonl silently replaced a/scored.jsonl (two equal rows).
    first = write_records(tmp_path / "a" / "scored.jsonl", HOSTILE)
    second = write_records(tmp_path / "b" / "scored.jsonl", [{**r, "meter": r["meter"][::-1]} for r in HOSTILE])
    assert main(inspect_argv([first, second], tmp_path / "r")) == 0
    figures = json.loads((tmp_path / "r" / "inspect.json").read_text())
    assert [arm["label"] for arm in figures["arms"]] == ["grpo", "deltattg [a/scored]", "deltattg [b/scored]"]
    credit = figures["shown"][0]["steps"][0]["credit"]
    assert credit["deltattg [a/scored]"] != credit["deltattg [b/scored]"]  # each file's own readings
    assert input_labels(["x/a/s.jsonl", "y/a/s.jsonl", "noisy.jsonl"]) == ["x/a/s", "y/a/s", "noisy"]
    code = main(inspect_argv([first, tmp_path / "a" / ".." / "a" / "scored.jsonl"], tmp_path / "twice"))
    assert code == 2 and "is given twice" in capsys.readouterr().err and not (tmp_path / "twice").exists()
    with pytest.raises(SystemExit) as exit_info:  # one method twice: two arms of one label
        main(inspect_argv([first], tmp_path / "twice", "grpo,deltattg,grpo"))
    assert exit_info.value.code == 2 and "name each estimator once" in capsys.readouterr().err
    arm = CreditArm("same", "grpo", read_trajectory_file(first).items)
    with pytest.raises(ValueError, match="labels must differ"):
        inspect_credit([arm, arm], CreditConfig())


def test_content_parts_and_table_breaking_actions(tmp_path):
    # A list of content parts (valid OpenAI chat) crashed the report after inspect.png was written; "|" and line
    # breaks in an action broke inspect.md's tables.
    src = write_records(tmp_path / "hostile.jsonl", HOSTILE)
    assert main(inspect_argv([src], tmp_path / "r", "grpo,deltattg,hgpo")) == 0
    text = (tmp_path / "r" / "inspect.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    steps = [row for row in rows if row.split(" | ")[0] in ("| 0", "| 1", "| 2")]
    assert len(steps) == 6 and all(len(re.split(r"(?<!\\)\|", row)) == 2 + 5 for row in steps)  # step, action, 3 arms
    assert "| 0 | open door |" in text and "| 1 | a \\| b |" in text
    assert "| 0 | line one<br>line two |" in text and "| 1 | x\\\\\\|y |" in text
    shown = json.loads((tmp_path / "r" / "inspect.json").read_text())["shown"]
    steps = {step["step"]: step["action"] for row in shown if row["id"] == "t1" for step in row["steps"]}
    assert steps == {0: "line one\nline two", 1: "x\\|y", 2: "look"}  # the JSON keeps the actions as they are
    assert markdown_cell("a|b\r\nc\\") == "a\\|b<br>c\\\\"


def test_a_failed_report_writes_none_of_its_files(tmp_path, capsys):
    # inspect.png used to be written first, then inspect.json, then inspect.md: a failure in between left a mix.
    src = write_records(tmp_path / "hostile.jsonl", HOSTILE)
    out = tmp_path / "r"
    (out / "inspect.md").mkdir(parents=True)  # inspect.md cannot be written
    (out / "inspect.png").write_bytes(b"an older picture")
    assert main(inspect_argv([src], out)) == 2
    assert "inspect.md: is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["inspect.md", "inspect.png"]  # no inspect.json, no temporary file
    assert (out / "inspect.png").read_bytes() == b"an older picture"


def test_inputs_that_differ_in_length_name_file_and_line(tmp_path, capsys):
    full = write_records(tmp_path / "full.jsonl", HOSTILE)
    short = write_records(tmp_path / "short.jsonl", HOSTILE[:2])
    for inputs in ([full, short], [short, full]):
        assert main(inspect_argv(inputs, tmp_path / "r")) == 2
        assert f"{full}:3: id: has no counterpart: {short} ends after 2 records" in capsys.readouterr().err
    fewer = write_records(tmp_path / "fewer.jsonl", [HOSTILE[0], scored_record(1, 0.0, ["a", "b"]), HOSTILE[2]])
    assert main(inspect_argv([full, fewer], tmp_path / "r")) == 2  # was an IndexError while writing the report
    assert f"{fewer}:2: step_tokens: trajectory 't1' has 2 steps here and 3 at {full}:2" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_trajectories_without_actions_under_every_method(tmp_path):
    from deltattg.credit import available_estimators, get_estimator

    methods = ",".join(m for m in available_estimators() if get_estimator(m).records_problem() is None)
    empty = scored_record(3, 0.0, [])
    for name, records in (("only", [scored_record(4, 1.0, []), empty]), ("mixed", [*HOSTILE, empty])):
        src = write_records(tmp_path / f"{name}.jsonl", records)
        assert main(inspect_argv([src], tmp_path / name, methods)) == 0
        figures = loads_strict((tmp_path / name / "inspect.json").read_text())  # NaN (no credit at all) is null
        assert set(figures["concentration"]) == set(methods.split(","))
