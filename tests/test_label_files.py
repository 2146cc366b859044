"""Label files that can be trusted (issue 46): a killed and resumed labelling run gives exactly the labels of an
uninterrupted one (for a random and an LM completer); labels made from another version of a trajectory (a pool
collected again under the same ids) are never taken for its labels; a resume under other settings, an environment
in which nothing replays, an outcome run over expensive labels, a second run on the same file and options a source
does not read are all refused, and nothing is written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import collect_household, exit_status, save_household_tokenizer
from deltattg.data.labels import LabelSettings
from deltattg.data.sources import read_trajectory_file
from deltattg.data.tokens import ActionTokens, located_step_tokens
from deltattg.hf import load_tokenizer
from deltattg.rollout.collect import build_policy, parse_policy
from deltattg.rollout.label_sources import labels_of_batch, make_labels, partial_path
from deltattg.rollout.output import held_file
from deltattg.rollout.policies import SamplingConfig
from deltattg.rollout.prompts import PromptConfig


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """A short household pool: noisy experts and random, groups of 4, 12 turns; its tokenizer; and a tiny random
    LM actor over that tokenizer (an LM completer)."""
    from deltattg.tiny import tiny_llama

    folder = tmp_path_factory.mktemp("pool")
    tokenizer = save_household_tokenizer(folder / "tok")
    path = collect_household(folder / "pool.jsonl", ["expert:0.3", "expert:0.6", "random"], 8, "--group-size", "4",
                             "--max-turns", "12", "--tokenizer", str(tokenizer))  # fmt: skip
    actor = folder / "actor"
    tiny_llama(load_tokenizer(str(tokenizer)), hidden=32, layers=1, heads=2, seed=3).save_pretrained(actor)
    load_tokenizer(str(tokenizer)).save_pretrained(actor)
    return path, tokenizer, actor


class StopAfter:
    """A completer that stops the run (as Ctrl-C does) at its ``calls``-th batched action; every attribute is the
    wrapped policy's, so the labeller reseeds it as it would the policy itself."""

    def __init__(self, policy, calls: int):
        self.__dict__.update(policy=policy, left=calls)

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def __setattr__(self, name, value):
        setattr(self.policy, name, value)

    def act(self, episodes):
        self.__dict__["left"] -= 1
        if self.left == 0:
            raise KeyboardInterrupt
        return self.policy.act(episodes)


def label(path: Path, out: Path, tokenizer: Path, completer: str, *, stop_after: int | None = None,
          cache: bool = False, source: str = "best-of-k"):
    """``make_labels`` of the pool at ``path`` into ``out`` (chunks of 4 trajectories, K = 2), as the CLI calls it."""
    items = read_trajectory_file(str(path)).items
    tok = load_tokenizer(str(tokenizer))
    settings = LabelSettings(source, completer=completer, completions=2, seed=5)

    def build():
        policy = build_policy(parse_policy(completer), 0, SamplingConfig(max_new_tokens=6), PromptConfig())
        return policy if stop_after is None else StopAfter(policy, stop_after)

    return make_labels(items, [located_step_tokens(item, tok) for item in items], settings, out, completer=build,
                       count_action=ActionTokens(tok), cache=cache, chunk=4, progress=False)


@pytest.mark.parametrize("completer", ["random", "lm"])
def test_a_killed_run_resumes_to_exactly_the_uninterrupted_labels(pool, tmp_path, completer):
    """Stopped mid-chunk (and again with a torn last line), the run leaves FILE.partial, not FILE; the same call
    resumes it, and the finished file equals the uninterrupted run's byte for byte: each chunk of trajectories draws
    its completions from its own stream, and the chunk that was cut is labelled again whole."""
    path, tokenizer, actor = pool
    spec = "random" if completer == "random" else f"lm:{actor}"
    whole = tmp_path / "whole.jsonl"
    label(path, whole, tokenizer, spec)
    cut = tmp_path / "cut.jsonl"
    with pytest.raises(KeyboardInterrupt):
        label(path, cut, tokenizer, spec, stop_after=40)
    assert not cut.exists() and partial_path(cut).exists()
    kept = partial_path(cut).read_text()
    assert kept and kept.count("\n") < whole.read_text().count("\n")  # some chunks done, not all
    partial_path(cut).write_text(kept + kept.splitlines()[0][:25])  # and a line torn by the kill
    labels, report = label(path, cut, tokenizer, spec)
    assert cut.read_bytes() == whole.read_bytes()
    assert not partial_path(cut).exists() and not list(tmp_path.glob(".*.lock"))
    assert 0 < report.reused < report.trajectories


def swapped_contents(path: Path, out: Path) -> int:
    """The pool at ``path`` collected again under the same ids: every trajectory keeps its id but takes the
    messages, steps and outcome of another one of its task's (another policy's); returns how many changed."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_group: dict[str, list[dict]] = {}
    for record in records:
        by_group.setdefault(record["group"], []).append(record)
    changed, out_records = 0, []
    for record in records:
        group = by_group[record["group"]]
        other = group[(group.index(record) + 1) % len(group)]
        keep = {"id": record["id"], "policy": record.get("policy")}
        new = {**other, **keep}
        changed += new["messages"] != record["messages"]
        out_records.append(new)
    out.write_text("".join(json.dumps(r) + "\n" for r in out_records))
    return changed


def test_a_pool_collected_again_under_the_same_ids_gets_its_own_labels(pool, tmp_path):
    """The label cache of a pool (train-meter's POOL.labels/) holds labels by trajectory id; when the pool is
    collected again in place with other actions, every changed trajectory is labelled again (counted), and the
    labels equal those of the new pool labelled from scratch."""
    path, tokenizer, _ = pool
    here = tmp_path / "pool.jsonl"
    here.write_text(path.read_text())
    cache = tmp_path / "pool.jsonl.labels" / "best-of-k.jsonl"
    label(here, cache, tokenizer, "random", cache=True)
    changed = swapped_contents(path, here)
    assert changed > 0
    labels, report = label(here, cache, tokenizer, "random", cache=True)
    fresh = tmp_path / "fresh.jsonl"
    expected, _ = label(here, fresh, tokenizer, "random")
    assert report.stale == changed
    assert labels == expected and cache.read_text() == fresh.read_text()


def test_a_label_file_of_other_content_is_refused(pool, tmp_path, capsys):
    """``labels --out L`` resumed on a pool whose trajectories changed under the same ids: refused with the file
    and line, L left as it was."""
    path, tokenizer, _ = pool
    out = tmp_path / "L.jsonl"
    options = ["--labels", "rollout", "--completer", "random", "--completions", "1", "--tokenizer", str(tokenizer),
               "--out", str(out), "--no-progress"]
    assert exit_status(["labels", str(path), *options]) == 0
    before = out.read_text()
    other = tmp_path / "other.jsonl"
    swapped_contents(path, other)
    capsys.readouterr()
    assert exit_status(["labels", str(other), *options]) == 2
    assert f"{out}:1: holds labels of trajectory" in capsys.readouterr().err
    assert out.read_text() == before and not partial_path(out).exists()


def test_a_resume_under_other_settings_is_refused(pool, tmp_path, capsys):
    """Every setting that shapes a label is recorded and compared on resume: the environment (--short), the turn
    limit, the completer's sampling, and the bootstrap meter's content (a meter retrained at the same path)."""
    from test_meter_regression import tiny_meter

    path, tokenizer, actor = pool
    out = tmp_path / "L.jsonl"
    base = ["labels", str(path), "--labels", "rollout", "--completions", "1", "--tokenizer", str(tokenizer),
            "--out", str(out), "--no-progress"]
    assert exit_status([*base, "--completer", "random", "--env", "household", "--short"]) == 0
    before = out.read_text()
    for changed in (["--completer", "random", "--env", "household"],
                    ["--completer", "random", "--env", "household", "--short", "--max-turns", "9"],
                    ["--completer", "random", "--env", "household", "--short", "--label-seed", "1"]):
        capsys.readouterr()
        assert exit_status([*base, *changed]) == 2, changed
        assert "holds labels made with other settings" in capsys.readouterr().err
        assert out.read_text() == before
    lm = tmp_path / "lm.jsonl"
    lm_base = [*base[:-3], "--out", str(lm), "--no-progress", "--completer", f"lm:{actor}"]
    assert exit_status([*lm_base, "--completer-max-new-tokens", "4"]) == 0
    assert exit_status([*lm_base, "--completer-max-new-tokens", "5"]) == 2
    meter = tmp_path / "meter"
    tiny_meter().save_pretrained(meter)
    td = ["labels", str(path), "--labels", "td", "--bootstrap-meter", str(meter), "--tokenizer", str(tokenizer),
          "--out", str(tmp_path / "T.jsonl"), "--no-progress"]
    assert exit_status(td) == 0
    tiny_meter(seed=1).save_pretrained(meter)  # retrained in place
    capsys.readouterr()
    assert exit_status(td) == 2 and "bootstrap_meter_sha256" in capsys.readouterr().err


def test_a_pool_that_replays_nowhere_is_refused(pool, tmp_path, capsys):
    """A --short pool read in the full household (no --short): not one state replays, so every label would be the
    outcome's under a best-of-k header. Refused (exit 2, the reason named); nothing written."""
    path, tokenizer, _ = pool
    out = tmp_path / "L.jsonl"
    assert exit_status(["labels", str(path), "--labels", "best-of-k", "--completer", "random", "--completions", "1",
                        "--env", "household", "--tokenizer", str(tokenizer), "--out", str(out),
                        "--no-progress"]) == 2  # fmt: skip
    assert "not one of" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_outcome_labels_do_not_replace_expensive_ones_nor_the_reverse(pool, tmp_path, capsys):
    path, tokenizer, _ = pool
    out = tmp_path / "L.jsonl"
    common = ["--tokenizer", str(tokenizer), "--out", str(out), "--no-progress"]
    assert exit_status(["labels", str(path), "--labels", "best-of-k", "--completer", "random", "--completions", "1",
                        *common]) == 0  # fmt: skip
    before = out.read_text()
    capsys.readouterr()
    assert exit_status(["labels", str(path), *common]) == 2
    assert "holds best-of-k labels" in capsys.readouterr().err and out.read_text() == before
    outcome = tmp_path / "O.jsonl"
    assert exit_status(["labels", str(path), *common[:-3], "--out", str(outcome), "--no-progress"]) == 0
    before = outcome.read_text()
    assert exit_status(["labels", str(path), "--labels", "best-of-k", "--completer", "random", *common[:-3],
                        "--out", str(outcome), "--no-progress"]) == 2  # fmt: skip
    assert outcome.read_text() == before


def test_two_runs_on_one_label_file_are_refused(pool, tmp_path, capsys):
    """While one run holds a label file (its lock beside it), a second one on the same file is refused, naming the
    holder, and writes nothing."""
    path, tokenizer, _ = pool
    out = tmp_path / "L.jsonl"
    with held_file(out):
        assert exit_status(["labels", str(path), "--labels", "rollout", "--completer", "random", "--completions",
                            "1", "--tokenizer", str(tokenizer), "--out", str(out), "--no-progress"]) == 2
    assert "another run" in capsys.readouterr().err
    assert not out.exists() and not partial_path(out).exists()


@pytest.mark.parametrize("source, extra", [
    ("outcome", ["--completions", "4"]), ("outcome", ["--label-seed", "0"]),
    ("outcome", ["--completer-temperature", "0.5"]), ("outcome", ["--env", "household"]),
    ("rollout", ["--completer", "random", "--td-lambda", "0"]),
    ("rollout", ["--completer", "random", "--completer-temperature", "0.5"]),
])  # fmt: skip
def test_options_a_source_does_not_read_are_refused(pool, tmp_path, capsys, source, extra):
    path, tokenizer, _ = pool
    out = tmp_path / "L.jsonl"
    assert exit_status(["labels", str(path), "--labels", source, *extra, "--tokenizer", str(tokenizer), "--out",
                        str(out)]) == 2  # fmt: skip
    flag = extra[-2]
    assert flag in capsys.readouterr().err and not out.exists()


def test_bench_style_labels_name_their_meter_not_its_path(tmp_path):
    """The regime records td's bootstrap meter by name and content digest: a seed folder read from elsewhere finds
    its labels' settings equal, a retrained meter does not."""
    from test_meter_regression import tiny_meter

    from deltattg.regime.config import RegimeConfig
    from deltattg.regime.stages import label_settings

    first, second = tmp_path / "a" / "meter", tmp_path / "b" / "meter"
    tiny_meter().save_pretrained(first)
    tiny_meter().save_pretrained(second)
    config = RegimeConfig()
    assert label_settings(config, "td", first) == label_settings(config, "td", second)
    tiny_meter(seed=1).save_pretrained(second)
    assert label_settings(config, "td", first) != label_settings(config, "td", second)
    assert replace(label_settings(config, "best-of-k"), seed=1) != label_settings(config, "best-of-k")


def test_a_batch_in_memory_gets_the_labels_a_file_would_have(pool, tmp_path):
    """``labels_of_batch`` (the on-policy meter refresh's labeller) labels trajectories held in memory as
    ``make_labels`` labels them into a file: with a deterministic completer (the expert, no mistakes) the labels are
    the same, state for state, and the completions are counted (once per distinct state); a batch it cannot key by id, or without step tokens,
    or a source without completions, is refused."""
    path, tokenizer, _ = pool
    items = read_trajectory_file(str(path)).items
    tok = load_tokenizer(str(tokenizer))
    trajectories = [replace(item.trajectory, step_tokens=located_step_tokens(item, tok)) for item in items]
    settings = LabelSettings("best-of-k", completer="expert:0.0", completions=2, seed=5)
    expert = build_policy(parse_policy("expert:0.0"), 0, SamplingConfig(max_new_tokens=6), PromptConfig())
    labels, cost = labels_of_batch(trajectories, settings, expert, ActionTokens(tok))
    from_file, _ = make_labels([replace(item, trajectory=t) for item, t in zip(items, trajectories)],
                               [t.step_tokens for t in trajectories], settings, tmp_path / "labels.jsonl",
                               completer=lambda: expert, count_action=ActionTokens(tok), progress=False)  # fmt: skip
    assert labels == from_file
    states = sum(t.num_steps for t in trajectories)
    assert cost.states == states and cost.unreplayable == 0 and cost.completer_tokens > 0
    assert 0 < cost.episodes < 2 * states and cost.episodes % 2 == 0  # K = 2 per distinct state: a group shares s_0
    assert any(not label.can_complete for t in trajectories for label in labels[t.id])  # not every state completable
    with pytest.raises(ValueError, match="repeats an id"):
        labels_of_batch(trajectories[:1] * 2, settings, expert, ActionTokens(tok))
    with pytest.raises(ValueError, match="no step_tokens"):
        labels_of_batch([replace(trajectories[0], step_tokens=None)], settings, expert, ActionTokens(tok))
    with pytest.raises(ValueError, match="not 'outcome'"):
        labels_of_batch(trajectories, LabelSettings("outcome"), expert, ActionTokens(tok))
