"""The regime's pool and labels do not depend on where the run folder lives: the base actor's trajectories are named
``actor/TASK#k`` (not after its folder) and the label completer ``actor``, so a seed folder moved or read through a
link finds the labels it made (``bench_train.py --meter-fit`` on a moved run once failed with a KeyError)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deltattg.regime.config import QUICK, RegimeConfig
from deltattg.regime.seeds import settings_moved
from deltattg.regime.stages import BaseActor, base_actor, build_world, collect_pool, label_settings, pool_labels

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_moved_run_folder_finds_the_base_actors_labels(tmp_path):
    config = RegimeConfig().replace(**QUICK).replace(pool=("random", "actor"), pool_episodes=4)
    world = build_world(config)
    first = base_actor(config, world, tmp_path / "run" / "actor")
    pool = collect_pool(config, world, first)
    settings = label_settings(config, "best-of-k")
    assert settings.completer == "actor" and settings.to_json()["completer"] == "actor"
    labels, report = pool_labels(config, world, first, pool, settings, tmp_path / "run" / "labels.jsonl")
    assert report.reused == 0 and report.cost is not None and report.cost.episodes > 0  # the actor completed states

    shutil.move(tmp_path / "run", tmp_path / "moved")
    moved = BaseActor(str(tmp_path / "moved" / "actor"), None, first.tokenizer)  # as bench_train reloads a seed
    again = collect_pool(config, world, BaseActor(moved.spec, first.model, first.tokenizer))
    assert [t.id for t in again] == [t.id for t in pool]
    assert sorted({t.id.split("/")[0] for t in pool}) == ["actor", "random"]
    assert {t.policy for t in pool} == {"actor", "random"}
    reread, report = pool_labels(config, world, moved, again, settings, tmp_path / "moved" / "labels.jsonl")
    assert report.reused == len(pool) and report.cost is None  # every label found, nothing completed again
    assert reread == labels


def test_a_seed_folders_path_is_written_as_seed_only_where_a_path_ends_in_its_name():
    text = ("actor: {model: /runs/h/seed-220/actor}\nrelative: seed-220/pool.jsonl\nquoted: '../seed-220/labels'\n"
            "other: /runs/myseed-220/actor\nlonger: /runs/seed-2200/actor\n")
    assert settings_moved(text, Path("/elsewhere/seed-220"), "SEED") == (
        "actor: {model: SEED/actor}\nrelative: SEED/pool.jsonl\nquoted: 'SEED/labels'\n"
        "other: /runs/myseed-220/actor\nlonger: /runs/seed-2200/actor\n")
