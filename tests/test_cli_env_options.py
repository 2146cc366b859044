"""``--env-option KEY=VALUE`` and ``--env-options regime``: the household environment's ``HouseholdConfig`` knobs from
the command line, on every command that builds an environment; the regime's own options as a preset that single
knobs override; refused, naming the knob, for an unknown key, another environment or a value the config rejects; and
the records collected so carry the options, so that the oracle and the label sources replay them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import exit_status
from docblocks import marked_block
from deltattg.cli import build_parser
from deltattg.cli.common import environment
from deltattg.envs.household import HouseholdConfig, vocabulary
from deltattg.regime.config import HOUSEHOLD_OPTIONS, RegimeConfig
from deltattg.tiny import word_tokenizer

COMMANDS_WITH_AN_ENVIRONMENT = (["collect"], ["evaluate"], ["guide"], ["verl-tasks"], ["labels", "x.jsonl"])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A word-level tokenizer over every word the short household tasks can show (the oracle's and labels')."""
    out = tmp_path_factory.mktemp("tok")
    word_tokenizer(vocabulary(HouseholdConfig.short())).save_pretrained(out)
    return out


def household_config(*argv: str) -> HouseholdConfig:
    """The config of the household environment ``collect ARGV`` builds."""
    args = build_parser().parse_args(["collect", "--env", "household", "--policy", "expert", "--episodes", "1",
                                      "--out", "unused.jsonl", *argv])  # fmt: skip
    _, probe, _ = environment(args, ["train"])
    return probe.config


def regime_config() -> HouseholdConfig:
    """The household config the regime plays (``HOUSEHOLD_OPTIONS`` over the short tasks), as its stages build it."""
    from deltattg.regime.stages import build_world

    return build_world(RegimeConfig()).env.config


def refusal(capsys, argv: list[str]) -> str:
    """The usage error ``deltattg ARGV`` ends with (exit status 2), whitespace collapsed."""
    assert exit_status(argv) == 2, argv
    return " ".join(capsys.readouterr().err.split())


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_values_are_read_as_yaml_over_the_chosen_size():
    config = household_config("--short", "--env-option", "receptacles=[3,4]", "--env-option", "start_closed=false",
                              "--env-option", "object_types=[apple, mug, book]", "--env-option", "n_train=7")
    assert config == HouseholdConfig.short(receptacles=(3, 4), start_closed=False,
                                           object_types=("apple", "mug", "book"), n_train=7)
    assert household_config("--env-option", "max_steps=30") == HouseholdConfig(max_steps=30)  # full size underneath


def test_the_regime_preset_is_what_the_regime_plays_and_single_options_override_it_in_order():
    assert household_config("--env-options", "regime") == regime_config()
    assert household_config("--env-options", "regime", "--short") == regime_config()  # complete: the size is moot
    overridden = household_config("--env-option", "n_train=5", "--env-options", "regime", "--env-option", "n_train=9",
                                  "--env-option", "start_closed=true")  # fmt: skip
    assert overridden == dataclasses.replace(regime_config(), n_train=9, start_closed=True)
    assert regime_config() == HouseholdConfig.short(**{k: tuple(v) if isinstance(v, list) else v
                                                       for k, v in HOUSEHOLD_OPTIONS.items()})  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS_WITH_AN_ENVIRONMENT, ids=lambda c: c[0])
def test_every_command_that_builds_an_environment_documents_both_flags(command, capsys):
    assert exit_status([*command[:1], "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--env-option KEY=VALUE" in shown and "--env-options {regime}" in shown


def test_an_unknown_key_is_refused_with_the_valid_ones(tmp_path, capsys):
    out = tmp_path / "pool.jsonl"
    err = refusal(capsys, ["collect", "--env", "household", "--env-option", "rooms=3", "--policy", "expert",
                           "--episodes", "1", "--out", str(out)])  # fmt: skip
    assert "--env-option rooms=3: 'rooms' is not a household option" in err
    assert "receptacles" in err and "start_closed" in err and "n_valid_unseen" in err
    err = refusal(capsys, ["collect", "--env", "household", "--env-option", "receptacles", "--policy", "expert",
                           "--episodes", "1", "--out", str(out)])  # fmt: skip
    assert "--env-option receptacles: write KEY=VALUE" in err
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--env-option", "receptacles=[3,4]"], ["--env-options", "regime"]],
                         ids=["env-option", "env-options"])
def test_the_options_are_refused_for_another_environment(tmp_path, capsys, flags):
    err = refusal(capsys, ["verl-tasks", "--env", "bfcl", *flags, "--out", str(tmp_path / "t.parquet")])
    assert f"{flags[0]}: HouseholdConfig options, only for --env household (not --env bfcl)" in err


@pytest.mark.parametrize(("entry", "message"), [
    ("receptacles=[1,2]", "--env-option receptacles: at least 3"),
    ("receptacles=[3,", "--env-option receptacles=[3,: receptacles: not a YAML value"),
    ("object_types=apple", "--env-option object_types=apple: object_types takes a list, e.g. "
                           "object_types=[alarmclock, apple]"),
    ("n_train=lots", "--env-option n_train: must be an integer"),
    ("task_types=[pick_and_fly]", "--env-option task_types: unknown ['pick_and_fly']"),
])  # fmt: skip
def test_a_bad_value_is_refused_naming_the_option(tmp_path, capsys, entry, message):
    out = tmp_path / "pool.jsonl"
    err = refusal(capsys, ["collect", "--env", "household", "--env-options", "regime", "--env-option", entry,
                           "--policy", "expert", "--episodes", "1", "--out", str(out)])  # fmt: skip
    assert message in err and not out.exists()


def test_labels_refuse_the_options_where_they_are_not_read(tmp_path, capsys, tokenizer_dir):
    pool = tmp_path / "pool.jsonl"
    assert exit_status(["collect", "--env", "household", "--short", "--policy", "expert", "--episodes", "1",
                        "--out", str(pool), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    err = refusal(capsys, ["labels", str(pool), "--out", str(tmp_path / "l.jsonl"), "--env-options", "regime"])
    assert "--env-options: not read by --labels outcome" in err
    err = refusal(capsys, ["labels", str(pool), "--out", str(tmp_path / "l.jsonl"), "--labels", "rollout",
                           "--completer", "expert", "--env-option", "n_train=5", "--tokenizer", str(tokenizer_dir)])
    assert "--env-option and --env-options, --data, --corpus, --retriever and --topk describe the environment" in err


def test_the_documented_regime_pool_replays_as_the_regime_plays_it(tmp_path, monkeypatch, tokenizer_dir):
    """The docs' command collects the regime's kind of tasks: the records carry the regime's options and its tasks,
    the oracle replays them to exactly the labels (a replay under other options would not match), and a rollout
    label source that rebuilds the environment from the same flags completes their states."""
    block = marked_block("docs/environments.md", "test_the_documented_regime_pool_replays_as_the_regime_plays_it")
    monkeypatch.chdir(tmp_path)
    (collect,) = block.commands()
    assert exit_status(collect) == 0
    records = read_jsonl(tmp_path / "regime-pool.jsonl")
    regime = regime_config()
    assert {json.dumps(r["env"]["options"], sort_keys=True) for r in records} == {
        json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(regime).items()}, sort_keys=True)}
    assert {r["env"]["max_turns"] for r in records} == {RegimeConfig().max_turns}
    from deltattg.envs.household import HouseholdEnv

    theirs = {task.id: task.data for task in HouseholdEnv(regime).tasks("train")}
    assert all(r["task"]["data"] == theirs[r["task"]["id"]] for r in records)

    tok = str(tokenizer_dir)
    expert = tmp_path / "expert.jsonl"
    expert.write_text("".join(json.dumps(r) + "\n" for r in records if r["policy"] == "expert-eps0"))
    assert exit_status(["labels", str(expert), "--out", "labels.jsonl", "--tokenizer", tok, "--no-progress"]) == 0
    assert exit_status(["score", str(expert), "--meter", "oracle", "--tokenizer", tok, "--out", "scored.jsonl",
                        "--no-progress"]) == 0  # fmt: skip
    labels = read_jsonl(tmp_path / "labels.jsonl")
    readings = [r for record in read_jsonl(tmp_path / "scored.jsonl") for r in record["meter"]]
    assert len(readings) == len(labels) > 10
    assert readings == [{"can_complete": True, "tokens_to_go": label["tokens_to_go"]} for label in labels]

    assert exit_status(["labels", str(expert), "--out", "rollout.jsonl", "--labels", "rollout", "--completer", "expert",
                        "--completions", "1", "--env", "household", "--env-options", "regime", "--tokenizer", tok,
                        "--no-progress"]) == 0  # fmt: skip
    rollout = read_jsonl(tmp_path / "rollout.jsonl")
    assert len(rollout) == len(labels) and all(label["can_complete"] for label in rollout)
    assert exit_status(["labels", str(expert), "--out", "short.jsonl", "--labels", "rollout", "--completer", "expert",
                        "--completions", "1", "--env", "household", "--short", "--tokenizer", tok,
                        "--no-progress"]) == 2  # fmt: skip
    assert not (tmp_path / "short.jsonl").exists()  # the short tasks' environment does not replay them
