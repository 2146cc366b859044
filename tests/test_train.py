"""The trainer on CPU with tiny real models: every estimator trains, resume after a kill continues exactly, DAPO's filter
drops exactly the zero-variance groups (and stops with a clear error when nothing is left), the meter is asked only
about A ≠ 0 trajectories, token-mean is exact.

The actor is a tiny random word-level Llama; outcomes are scripted (``ScriptedOutcomes``), not left to what the actor
happens to sample, so every group has reward variance on any machine. The meter is a tiny random ``RegressionMeter``
or the household oracle.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaModel

from collections import Counter

from deltattg.data.labels import StateLabel
from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import StepResult
from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.hf import load_tokenizer
from deltattg.loss import LossConfig, policy_loss
from deltattg.meter.base import CachedMeter
from deltattg.meter.loading import read_states
from deltattg.meter.regression import RegressionConfig, RegressionMeter
from deltattg.meter.train_regression import OnPolicyRefresh
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, NoisyExpertPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig
from deltattg.tiny import tiny_llama, word_tokenizer
from deltattg.train import (
    demonstrations,
    informative_groups,
    load,
    resolve,
    train,
)
from deltattg.train.cli import main as train_main
from deltattg.train.config import AlgoConfig, OptimConfig, RolloutConfig, dump, with_changes
from deltattg.train.rollouts import DynamicSamplingExhausted, TaskSampler, collect
from deltattg.train.rows import Row, collate, response_logits, response_logprobs, response_outputs, rows_logprobs
from deltattg.train.rows import rows_logprobs_and_hidden
from deltattg.train import trainer as trainer_module
from deltattg.train.trainer import ppo_update, shuffled_by_prompt

EASY = {  # plans of 7-9 actions: no episode of MAX_TURNS can win by itself, only by script
    "n_train": 2,
    "n_valid_seen": 2,
    "plan_length": [7, 9],
    "task_types": ["pick_two_obj_and_place"],
}
MAX_TURNS = 6
METHODS = ["grpo", "dapo", "deltattg", "pos", "rho0", "feas", "logit", "value", "gigpo", "hgpo", "delta", "igpo",
           "a2tgpo", "crest"]
TIMING = ("time/", "meter_share")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def easy_env() -> HouseholdEnv:
    return HouseholdEnv(HouseholdConfig.short(**{k: tuple(v) if isinstance(v, list) else v for k, v in EASY.items()}))


class ScriptedOutcomes:
    """A constructor of household environments whose outcome is scripted, whatever the actor does: the k-th reset of
    a task (counted per task over every instance made) wins on action ``wins(k)`` (None: never wins). Groups reset a
    task G times in a row, so with ``wins`` alternating every group has both outcomes; the count depends only on
    which tasks were sampled, so a resumed run sees the outcomes a straight run sees. Observations, admissible
    actions and ``describe()`` are the real environment's (the oracle meter replays them). ``verified`` (k, step) ->
    bool, when given, scripts each step's verified outcome too (CrEST's input; else the real admissibility)."""

    def __init__(self, wins=lambda k: {0: 1, 2: 3}.get(k % 4), verified=None):
        self.wins, self.verified = wins, verified
        self.resets: Counter[str] = Counter()

    def __call__(self) -> "Scripted":
        return Scripted(easy_env(), self)


class Scripted:
    def __init__(self, inner: HouseholdEnv, script: ScriptedOutcomes):
        self.inner, self.script = inner, script
        self.name, self.system_prompt, self.max_steps = inner.name, inner.system_prompt, inner.max_steps
        self.tasks, self.admissible_actions, self.vocabulary = inner.tasks, inner.admissible_actions, inner.vocabulary
        self.describe, self.reference_answer = inner.describe, inner.reference_answer

    def reset(self, task):
        self.reset_count = self.script.resets[task.id]
        self.win_at = self.script.wins(self.reset_count)
        self.script.resets[task.id] += 1
        self.steps = 0
        return self.inner.reset(task)

    def step(self, action):
        result = self.inner.step(action)
        assert not result.won, "EASY tasks cannot be won within MAX_TURNS"
        self.steps += 1
        won = self.steps == self.win_at
        info = {**result.info, "won": won}
        if self.script.verified is not None:
            info["verified"] = self.script.verified(self.reset_count, self.steps)
        return StepResult(result.observation, float(won), won or result.done, info)


@pytest.fixture(scope="module")
def actor_dir(tmp_path_factory) -> Path:
    """A tiny random Llama (h64) over the household vocabulary, saved as the trainer loads any actor."""
    config = resolve("household-tiny", overrides=["actor.tiny_hidden=64", "actor.tiny_heads=2"])
    from deltattg.train.actor import load_actor

    model, tokenizer = load_actor(config.actor, easy_env(), PromptConfig(), MAX_TURNS, seed=0)
    out = tmp_path_factory.mktemp("actor")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_regression_meter(tokenizer, seed: int = 0, target: str = "ttg") -> RegressionMeter:
    torch.manual_seed(seed)
    backbone = LlamaModel(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096))  # fmt: skip
    return RegressionMeter(
        backbone, tokenizer, RegressionConfig(backbone="tiny", max_length=4096, head_hidden=16, target=target)
    ).eval()


@pytest.fixture(scope="module")
def meter_dir(tmp_path_factory, actor_dir) -> Path:
    out = tmp_path_factory.mktemp("meter")
    tiny_regression_meter(load_tokenizer(str(actor_dir))).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def score_meter_dir(tmp_path_factory, actor_dir) -> Path:
    """An outcome-score meter (``train-meter --target score``): what the ``value`` ablation reads."""
    out = tmp_path_factory.mktemp("score-meter")
    tiny_regression_meter(load_tokenizer(str(actor_dir)), target="score").save_pretrained(out)
    return out


def small_overrides(out: Path | str, actor: Path | str, method: str, meter: Path | str | None, *extra: str) -> list[str]:
    return [
        f"actor.model={actor}", f"env.options={json.dumps(EASY)}", f"algo.method={method}",
        "rollout.batch_size=2", "rollout.group_size=4", f"rollout.max_turns={MAX_TURNS}", "rollout.max_new_tokens=10",
        "optim.lr=1e-3", "optim.mini_batch_size=24", "optim.micro_batch_size=16",
        "eval.every=2", "eval.num_tasks=2", "run.steps=2", "run.save_every=2", f"run.out={out}", "run.progress=false",
        "run.threads=1", "credit.failure_cost=256", *([f"meter.path={meter}"] if meter else []), *extra,
    ]  # fmt: skip


def small_config(out: Path, actor: Path, method: str, meter: Path | None, *extra: str):
    return resolve("household-tiny", overrides=small_overrides(out, actor, method, meter, *extra))


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING)}


# ---- a 2-step run of every estimator ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [*METHODS, "deltattg+oracle"])
def test_two_steps_of_each_method_train_and_log(tmp_path, actor_dir, meter_dir, score_meter_dir, method):
    method, _, oracle = method.partition("+")
    meter = oracle or {"grpo": None, "dapo": None, "gigpo": None, "hgpo": None, "delta": None, "igpo": None,
                       "a2tgpo": None, "crest": None, "value": score_meter_dir}.get(method, meter_dir)  # fmt: skip
    config = small_config(tmp_path / "run", actor_dir, method, meter)
    scales = []  # the clip_scale of every policy_loss call: only A²TGPO's per-row clip factors reach the loss
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "policy_loss",
                      lambda *a, **k: scales.append(k.get("clip_scale")) or policy_loss(*a, **k))  # fmt: skip
        verified = {"verified": lambda k, step: (k + step) % 3 != 0} if method == "crest" else {}  # varies per turn
        records = train(config, make_env=ScriptedOutcomes(**verified))
    assert any(s is not None for s in scales) == (method == "a2tgpo")

    assert [r["step"] for r in records] == [0, 1, 2]
    assert [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == records
    assert load(tmp_path / "run" / "config.yaml") == config
    before, after = weights(actor_dir), weights(tmp_path / "run" / "checkpoints" / "step-2" / "actor")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for r in records[1:]:
        assert "rollout_logprob_gap" not in r  # the preset's θ_old log-probs are the sampler's: nothing recomputed
        assert r["train/rows"] > 0 and r["optimizer_steps"] >= 1 and "eval/greedy_success" in records[0]
        assert r["cumulative_response_tokens"] == sum(q["rollout/response_tokens"] for q in records[1 : r["step"] + 1])
        assert sum(v for k, v in r.items() if k.startswith("credit/")) == r["train/trajectories"]
        assert 0.0 <= r["meter_share"] < 1.0
    assert any(r["advantage/nonzero_trajectories"] > 0 for r in records[1:]), "no reward variance: the test is vacuous"
    if method == "dapo":  # every scripted group has both outcomes: the first generation batch is kept whole
        assert all(r["dapo/kept_groups"] == 2 and r["dapo/gen_batches"] == 1 for r in records[1:])
        assert config.loss.kl_coef == 0.0 and "kl" not in records[1]
    elif method == "grpo":
        assert all(r["credit/outcome_only"] == r["advantage/nonzero_trajectories"] for r in records[1:])
    elif method in ("gigpo", "hgpo"):  # per-step terms from the rollouts' own observations; no meter read
        assert all(r["credit/step_groups"] > 0 and "meter/trajectories" not in r for r in records[1:])
    elif method in ("igpo", "a2tgpo"):  # the actor's own log-probs of the reference answer; no meter read
        for r in records[1:]:
            assert r["credit/information_gain"] > 0 and "meter/trajectories" not in r
            assert r["answer/rows"] > 0 and r["answer/logprob_first"] < 0 and r["time/answer"] > 0
            if method == "a2tgpo":  # c = 1 + 0.3(2σ(ĨG) − 1): both sides of 1 within a turn group, inside (0.7, 1.3)
                assert r["clip/scaled_rows"] > 0 and 0.7 < r["clip/scale_min"] < 1 < r["clip/scale_max"] < 1.3
            else:
                assert "clip/scale_min" not in r
        if method == "a2tgpo":
            assert any(bool((s != 1).any()) for s in scales if s is not None)
    elif method == "delta":  # GRPO's A_i reweighted per token by ω from θ_old's hidden states: token mean 1
        for r in records[1:]:
            assert r["credit/outcome_only"] == r["advantage/nonzero_trajectories"] and "meter/trajectories" not in r
            assert r["delta/omega_mean"] == pytest.approx(1.0, abs=1e-5) and r["delta/omega_std"] > 0
            assert 0 < r["delta/omega_min"] < 1 < r["delta/omega_max"] <= 1.2 / 0.8
    elif method == "crest":  # Ã = A + 0.5·ṽ (admissibility per turn), times w ∈ [0.8, 1.2] from the self-teacher
        for r in records[1:]:
            assert r["credit/verified_turns"] > 0 and "meter/trajectories" not in r
            assert r["verified/known"] == 1.0 and 0 < r["verified/rate"] < 1  # every step scripted True or False
            assert 0.8 - 1e-6 <= r["crest/weight_min"] <= r["crest/weight_mean"] <= r["crest/weight_max"] <= 1.2 + 1e-6
            assert r["crest/weight_std"] > 0 and r["crest/amplified"] + r["crest/damped"] > 0
            assert 0 < r["crest/teacher_entropy"] <= 1 and r["time/teacher"] > 0
    else:  # only the A ≠ 0 trajectories were read; every reading counted
        for r in records[1:]:
            assert r["meter/trajectories"] == r["advantage/nonzero_trajectories"]
            assert r["meter/invalid"] == 0 and r["credit/invalid_group"] == 0
            if oracle:  # the planner sees no way to finish 7+ actions in 6 turns: every state reads "will fail"
                assert r["credit/all_unsuccessful"] == r["advantage/nonzero_trajectories"]
        if not oracle:
            assert sum(r["credit/redistributed"] + r["credit/zero_mass"] for r in records[1:]) > 0


@pytest.mark.parametrize("mode", ["clip_cov", "kl_cov"])
def test_the_entropy_guards_reach_the_trainers_loss(tmp_path, actor_dir, mode):
    """``loss.loss_mode`` swaps the surrogate for verl's guard of that name; the step logs the share it singled out."""
    config = small_config(tmp_path / "run", actor_dir, "grpo", None, "run.steps=1", "eval.every=0",
                          f"loss.loss_mode={mode}", "loss.clip_cov_ratio=0.1", "loss.kl_cov_ratio=0.1",
                          "loss.clip_cov_lb=-1e9", "loss.clip_cov_ub=1e9")  # fmt: skip
    modes = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "policy_loss", lambda *a, **k: modes.append(a[4].loss_mode) or policy_loss(*a, **k))
        records = train(config, make_env=ScriptedOutcomes())
    assert modes and set(modes) == {mode}
    step = records[-1]
    assert step["advantage/nonzero_trajectories"] > 0, "no reward variance: the test is vacuous"
    # ⌊0.1·N⌋ tokens of each micro-batch of N (every token a candidate: the bounds hold all): about a tenth
    assert 0.05 < step["cov_guard_frac"] <= 0.1 + 1e-9


def test_value_needs_an_outcome_score_meter(tmp_path, actor_dir, meter_dir):
    """``value`` reads S(h) from a score meter; a Token-to-Go meter's completion logit is not silently turned into one."""
    with pytest.raises(ValueError, match="value reads 'score'"):
        train(small_config(tmp_path / "run", actor_dir, "value", meter_dir), make_env=ScriptedOutcomes())


def test_recomputed_old_logprobs_equal_the_sampled_ones(tmp_path, actor_dir):
    config = small_config(tmp_path / "run", actor_dir, "grpo", None, "optim.recompute_old_logprobs=true")
    records = train(config, make_env=ScriptedOutcomes())
    assert all(r["rollout_logprob_gap"] < 1e-4 for r in records[1:])  # θ_old's forward pass = the sampler's log-probs


@pytest.mark.parametrize("recompute", ["false", "true"])
def test_delta_with_unit_lambdas_updates_exactly_like_grpo(tmp_path, actor_dir, recompute):
    """λ_min = λ_max = 1 makes every ω exactly 1: DelTA's per-token advantages are GRPO's, row for row and token for
    token, so one step from the same seed gives GRPO's weights — whether θ_old is the sampler's (DelTA still runs its
    no-grad pass for the hidden states) or recomputed (that pass's log-probs are θ_old's)."""
    one_step = ("run.steps=1", "run.save_every=1", "eval.every=0", f"optim.recompute_old_logprobs={recompute}",
                "credit.delta_lambda_min=1", "credit.delta_lambda_max=1")  # fmt: skip
    after, logged = {}, {}
    for method in ("grpo", "delta"):
        config = small_config(tmp_path / method, actor_dir, method, None, *one_step)
        logged[method] = train(config, make_env=ScriptedOutcomes())[-1]
        after[method] = weights(tmp_path / method / "checkpoints" / "step-1" / "actor")
    assert all(torch.equal(after["grpo"][k], after["delta"][k]) for k in after["grpo"])
    assert any(not torch.equal(after["delta"][k], v) for k, v in weights(actor_dir).items())
    assert logged["delta"]["delta/omega_min"] == logged["delta"]["delta/omega_max"] == 1.0
    assert logged["delta"]["loss"] == logged["grpo"]["loss"]
    assert ("rollout_logprob_gap" in logged["delta"]) == (recompute == "true")


@pytest.mark.parametrize("recompute", ["false", "true"])
def test_crest_without_its_terms_updates_exactly_like_grpo(tmp_path, actor_dir, recompute):
    """β_v = 0 and ε_w = 0 make Ã = A_i and every w exactly 1: CrEST's per-token advantages are GRPO's, so one step
    from the same seed gives GRPO's weights (the self-teacher's pass still runs, and touches neither the weights nor
    the RNG streams)."""
    one_step = ("run.steps=1", "run.save_every=1", "eval.every=0", f"optim.recompute_old_logprobs={recompute}",
                "credit.crest_beta=0", "credit.crest_epsilon=0")  # fmt: skip
    after, logged = {}, {}
    for method in ("grpo", "crest"):
        config = small_config(tmp_path / method, actor_dir, method, None, *one_step)
        logged[method] = train(config, make_env=ScriptedOutcomes())[-1]
        after[method] = weights(tmp_path / method / "checkpoints" / "step-1" / "actor")
    assert all(torch.equal(after["grpo"][k], after["crest"][k]) for k in after["grpo"])
    assert logged["crest"]["crest/weight_min"] == logged["crest"]["crest/weight_max"] == 1.0
    assert logged["crest"]["loss"] == logged["grpo"]["loss"] and logged["crest"]["time/teacher"] > 0


def test_dapo_that_keeps_no_group_stops_naming_the_setting(tmp_path, actor_dir):
    config = small_config(tmp_path / "run", actor_dir, "dapo", None, "algo.max_gen_batches=3")
    with pytest.raises(DynamicSamplingExhausted, match=r"algo\.max_gen_batches=3.*all 6 groups"):
        train(config, make_env=ScriptedOutcomes(wins=lambda k: None))  # every rollout loses
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0]  # the evaluation before training; no empty step was logged


# ---- resume after a kill ---------------------------------------------------------------------------------------------
def logged_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_resume_continues_exactly(tmp_path, actor_dir, meter_dir):
    straight = train(small_config(tmp_path / "a", actor_dir, "deltattg", meter_dir, "run.steps=4"),
                     make_env=ScriptedOutcomes())  # fmt: skip
    b = tmp_path / "b"
    first = train(small_config(b, actor_dir, "deltattg", meter_dir, "run.steps=2", "run.keep_checkpoints=1"),
                  make_env=ScriptedOutcomes())  # dies  # fmt: skip
    resumed = train(small_config(b, actor_dir, "deltattg", meter_dir, "run.steps=4", "run.keep_checkpoints=1"),
                    resume="latest", make_env=ScriptedOutcomes())  # fmt: skip
    assert any(r.get("meter/trajectories", 0) > 0 for r in straight), "the meter was never read: the test is vacuous"
    assert [without_timing(r) for r in first] == [without_timing(r) for r in straight[:3]]
    assert [without_timing(r) for r in resumed] == [without_timing(r) for r in straight]
    assert logged_steps(b) == [0, 1, 2, 3, 4]
    assert [p.name for p in (b / "checkpoints").iterdir()] == ["step-4"]


def test_saved_config_names_absolute_paths_so_a_resume_works_from_any_folder(tmp_path, actor_dir, meter_dir,
                                                                             monkeypatch):
    """Relative ``actor.model``, ``meter.path`` and ``run.out`` as typed are saved absolute in ``config.yaml``: a
    resume started from another working folder finds the actor and the meter (it used to ask the Hub for ``actor``)."""
    work = tmp_path / "work"
    shutil.copytree(actor_dir, work / "actor")
    shutil.copytree(meter_dir, work / "meter")
    monkeypatch.chdir(work)
    settings = small_overrides("run", "actor", "deltattg", "meter", "run.steps=1")
    assert train_main(["--preset", "household-tiny", *(arg for s in settings for arg in ("--set", s))]) == 0
    saved = yaml.safe_load((work / "run" / "config.yaml").read_text())
    assert (saved["actor"]["model"], saved["meter"]["path"], saved["run"]["out"]) == (
        str(work / "actor"), str(work / "meter"), str(work / "run"))
    monkeypatch.chdir(tmp_path)
    assert train_main(["--out", str(work / "run"), "--resume", "--set", "run.steps=2"]) == 0
    assert logged_steps(work / "run") == [0, 1, 2]


def test_on_policy_refresh_trains_the_meter_head_and_resumes_exactly(tmp_path, actor_dir, meter_dir):
    """meter.refresh_every=1: after every step's credit the meter's head trains on that batch (the backbone stays);
    its readings at the next step are the refreshed head's, and a resumed run reloads the refreshed head from the
    checkpoint, so its metrics equal the uninterrupted run's."""
    refresh = ("meter.refresh_every=1", "meter.refresh_lr=1e-2")
    straight = train(small_config(tmp_path / "a", actor_dir, "deltattg_robust", meter_dir, "run.steps=4", *refresh),
                     make_env=ScriptedOutcomes())  # fmt: skip
    losses = [r["meter/refresh_loss"] for r in straight if "meter/refresh_loss" in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert all(r["meter/refresh_states"] > 0 for r in straight if "meter/refresh_states" in r)
    b = tmp_path / "b"
    train(small_config(b, actor_dir, "deltattg_robust", meter_dir, "run.steps=2", "run.keep_checkpoints=1", *refresh),
          make_env=ScriptedOutcomes())  # fmt: skip
    resumed = train(small_config(b, actor_dir, "deltattg_robust", meter_dir, "run.steps=4", "run.keep_checkpoints=1",
                                 *refresh), resume="latest", make_env=ScriptedOutcomes())  # fmt: skip
    assert [without_timing(r) for r in resumed] == [without_timing(r) for r in straight]
    frozen = train(small_config(tmp_path / "c", actor_dir, "deltattg_robust", meter_dir, "run.steps=4"),
                   make_env=ScriptedOutcomes())  # fmt: skip
    assert [r.get("trust/auc") for r in frozen][2:] != [r.get("trust/auc") for r in straight][2:] or \
        [r.get("advantage/abs_mean") for r in frozen] != [r.get("advantage/abs_mean") for r in straight]
    state = torch.load(b / "checkpoints" / "step-4" / "trainer_state.pt", weights_only=True)
    saved = RegressionMeter.from_pretrained(meter_dir).head.state_dict()
    assert any(not torch.equal(state["meter_head"][k], saved[k]) for k in saved)  # the head did move
    with pytest.raises(ValueError, match="oracle reads the planner"):
        small_config(tmp_path / "d", actor_dir, "deltattg", "oracle", "meter.refresh_every=1")


def test_a_refresh_learns_the_labels_it_is_given(actor_dir):
    """``OnPolicyRefresh.update(labels=...)`` (what ``meter.refresh_labels=best-of-k`` hands it) learns those labels,
    not the outcomes: states of failed trajectories, labelled completable, read as completable after the refresh,
    and as hopeless after a refresh on their outcomes."""
    tokenizer = load_tokenizer(str(actor_dir))
    failed = [dataclasses.replace(t, success=False, reward=0.0, step_tokens=[4] * t.num_steps)
              for t in expert_trajectories()]  # fmt: skip
    completable = {t.id: [StateLabel(True, 4.0 * (t.num_steps - k), "best-of-k") for k in range(t.num_steps + 1)]
                   for t in failed}  # fmt: skip

    def read_after_refresh(labels):
        meter = tiny_regression_meter(tokenizer)
        record = OnPolicyRefresh(meter, lr=1e-2, epochs=20).update(failed, seed=0, labels=labels)
        assert record["meter/refresh_states"] == sum(t.num_steps + 1 for t in failed)
        rows = read_states(meter.eval(), failed)[0]
        return sum(r.probability for row in rows for r in row) / sum(len(row) for row in rows)

    assert read_after_refresh(completable) > 0.9 and read_after_refresh(None) < 0.1


def as_text(records: list[dict]) -> list[str]:
    """Records without their timings as JSON text: equal where a NaN (robust DeltaTTG's trust AUC of a batch with
    one outcome) is equal."""
    return [json.dumps(without_timing(r), sort_keys=True) for r in records]


def test_a_best_of_k_refresh_completes_the_batch_with_the_current_actor(tmp_path, actor_dir, meter_dir):
    """``meter.refresh_labels=best-of-k``: every refresh replays the batch's states in the run's environment and the
    current actor completes each K times, the cost (and the meter's agreement with the labels before it learns them,
    and the meter's as loaded: the same at the first refresh) in the step's record; the completions draw from a stream of their
    own, so the next steps' rollouts are those of a run whose refresh reads outcomes, and a resumed run equals the
    straight one (EASY tasks cannot be won: the labels are the outcomes' here and robust DeltaTTG's trust AUC is
    NaN; the test above checks that labels given are learnt)."""
    best = ("meter.refresh_every=1", "meter.refresh_labels=best-of-k", "meter.refresh_completions=2")
    straight = train(small_config(tmp_path / "a", actor_dir, "deltattg_robust", meter_dir, "run.steps=3", *best))
    refreshes = [r for r in straight if "meter/refresh_states" in r]
    assert len(refreshes) == 3
    assert all(r["meter/refresh_completion_episodes"] > 0 and r["meter/refresh_completer_tokens"] > 0
               and r["meter/refresh_unreplayable"] == 0 for r in refreshes)  # fmt: skip
    assert all(0 <= r["meter/refresh_before_delta_sign_agreement"] <= 1 for r in refreshes)  # read before it learns
    first = {k.replace("frozen", "before"): v for k, v in refreshes[0].items() if k.startswith("meter/refresh_frozen_")}
    assert len(first) == 4 and json.dumps(first) == json.dumps({k: refreshes[0][k] for k in first})  # nothing learnt yet
    outcome = train(small_config(tmp_path / "o", actor_dir, "deltattg_robust", meter_dir, "run.steps=3",
                                 "meter.refresh_every=1"))  # fmt: skip
    rollouts = [{k: v for k, v in r.items() if k.startswith("rollout/")} for r in straight[1:]]
    assert rollouts[-1] and rollouts == [{k: v for k, v in r.items() if k.startswith("rollout/")} for r in outcome[1:]]
    b = tmp_path / "b"
    train(small_config(b, actor_dir, "deltattg_robust", meter_dir, "run.steps=2", "run.keep_checkpoints=1", *best))
    resumed = train(small_config(b, actor_dir, "deltattg_robust", meter_dir, "run.steps=3", "run.keep_checkpoints=1",
                                 *best), resume="latest")  # fmt: skip
    assert as_text(resumed) == as_text(straight)
    with pytest.raises(ValueError, match="refresh_labels must be one of outcome, best-of-k"):
        small_config(tmp_path / "d", actor_dir, "deltattg", meter_dir, "meter.refresh_labels=planner")
    with pytest.raises(ValueError, match="refresh_delta_weight must be >= 0"):
        small_config(tmp_path / "d", actor_dir, "deltattg", meter_dir, "meter.refresh_delta_weight=-1")


@pytest.mark.slow
def test_resume_after_sigkill_continues_exactly(tmp_path, actor_dir, meter_dir):
    straight = train(small_config(tmp_path / "a", actor_dir, "deltattg", meter_dir, "run.steps=4"))
    b = tmp_path / "b"
    config = small_config(b, actor_dir, "deltattg", meter_dir, "run.steps=4")
    (tmp_path / "b.yaml").write_text(dump(config))
    command = [sys.executable, "-m", "deltattg.train", "--config", str(tmp_path / "b.yaml")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    step2 = b / "checkpoints" / "step-2"
    deadline = time.monotonic() + 300
    while not step2.is_dir() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run ended before the kill: nothing was interrupted"
    resumed = train(config, resume=step2)
    assert [without_timing(r) for r in resumed[3:]] == [without_timing(r) for r in straight[3:]]
    assert logged_steps(b) == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == ["step-2", "step-4"]


# ---- DAPO's dynamic sampling -----------------------------------------------------------------------------------------
def test_dapo_filter_drops_exactly_the_zero_variance_groups():
    rewards = [
        [1, 1, 1, 1],
        [0, 0, 0, 0],
        [1, 0, 0, 0],
        [0.5, 0.5, 0.5, 0.5 + 1e-5],
        [0.2, 0.2, 0.2, 0.2 + 5e-4],
        [0.3],
    ]
    reward = torch.tensor([r for group in rewards for r in group], dtype=torch.float64)
    group = torch.tensor([g for g, rs in enumerate(rewards) for _ in rs])
    assert informative_groups(reward, group, 1e-4).tolist() == [False, False, True, False, True, False]


def test_dynamic_sampling_keeps_only_informative_groups_and_stops():
    env = HouseholdEnv(HouseholdConfig.short())
    rollout = RolloutConfig(batch_size=3, group_size=4, max_turns=8)
    algo = AlgoConfig(method="dapo", dynamic_sampling=True, max_gen_batches=4)
    sampler = TaskSampler(env.tasks("train"), 0)
    batch = collect(NoisyExpertPolicy(0.6, seed=0), lambda: HouseholdEnv(env.config), sampler, rollout, algo)
    groups = [batch.trajectories[k : k + 4] for k in range(0, len(batch.trajectories), 4)]
    assert 1 <= len(groups) <= 3 and batch.gen_batches <= 4
    assert all(len({t.reward for t in g}) > 1 for g in groups)
    assert len(batch.generated) == 12 * batch.gen_batches
    if len(groups) < 3:
        assert batch.gen_batches == 4


# ---- the meter is asked only about A ≠ 0 trajectories ----------------------------------------------------------------
class CountingMeter(RegressionMeter):
    """A real regression meter that remembers what it was asked to read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[list[dict]] = []

    def score_trajectories(self, trajectories):
        self.asked += [list(t) for t in trajectories]
        return super().score_trajectories(trajectories)


def expert_trajectories(n_tasks: int = 3, group: int = 3) -> list[Trajectory]:
    env = HouseholdEnv(HouseholdConfig.short())
    return run_episodes(lambda: HouseholdEnv(env.config), env.tasks("train")[:n_tasks], NoisyExpertPolicy(0.5, seed=3),
                        group_size=group, max_turns=6)  # fmt: skip


def test_meter_reads_only_queried_trajectories_in_one_call(actor_dir):
    trajectories = expert_trajectories()
    trajectories.append(trajectories[0])  # an identical trajectory is read once
    queried = [k % 2 == 0 for k in range(len(trajectories))]
    base = tiny_regression_meter(load_tokenizer(str(actor_dir)))
    meter = CountingMeter(base.backbone, base.tokenizer, base.config, base.head).eval()
    readings, stats = read_states(meter, trajectories, queried)
    distinct = {json.dumps(t.messages) for t, q in zip(trajectories, queried) if q}
    assert sorted(json.dumps(m) for m in meter.asked) == sorted(distinct)
    assert stats.trajectories == sum(queried) and stats.sent == len(distinct)
    assert stats.states == sum(t.num_steps for t, q in zip(trajectories, queried) if q)
    for t, q, row in zip(trajectories, queried, readings):
        assert len(row) == t.num_steps and all((r is not None) == q for r in row)

    # The Meter protocol path (no single-pass method): one call with the distinct decision prefixes only.
    cached = CachedMeter(base)
    protocol_readings, protocol_stats = read_states(cached, trajectories, queried)
    prefixes = {json.dumps(h) for t, q in zip(trajectories, queried) if q for h in t.prefixes()}
    assert cached.stats.requested == len(prefixes) == protocol_stats.sent
    assert [[r is None for r in row] for row in protocol_readings] == [[r is None for r in row] for row in readings]
    first = next(k for k, q in enumerate(queried) if q)
    assert [r.logit for r in protocol_readings[first]] == pytest.approx([r.logit for r in readings[first]], abs=1e-4)


# ---- rows, log-probs and the update ----------------------------------------------------------------------------------
def test_padded_rows_with_shared_prompts_give_the_unpadded_logprobs():
    tokenizer = word_tokenizer("a b c d e f".split())
    model = tiny_llama(tokenizer, hidden=32, layers=1, heads=2).eval()
    rows = [Row([5, 6, 7, 8, 9], [10, 11], 0, 0), Row([5, 6], [7, 8, 9, 10], 0, 1), Row([7], [5], 1, 0),
            Row([5, 6], [9], 1, 1), Row([5, 6, 7, 8, 9], [11, 10, 9], 2, 0)]  # two prompts read once, shared
    batched = rows_logprobs(model, rows, tokenizer.pad_token_id, temperature=0.7, micro_batch_size=3)
    for row, got in zip(rows, batched):
        with torch.no_grad():
            logits = model(torch.tensor([row.prompt + row.response])).logits[0, len(row.prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(row.response)[:, None])[:, 0]
        assert got.tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    alone = rows_logprobs(model, rows[:3], tokenizer.pad_token_id, temperature=0.7, micro_batch_size=3)  # no sharing
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(alone, batched))
    batch = collate(rows, tokenizer.pad_token_id)
    assert batch.prompt_ids.shape == (3, 5) and batch.prompt_of.tolist() == [0, 1, 2, 1, 0]
    logprobs, entropy = response_logprobs(model, batch, 1.0, entropy_grad=False)
    assert logprobs.shape == entropy.shape == (5, 4) and (entropy[0, 2:] == 0).all() and (entropy[0, :2] > 0).all()


@pytest.mark.parametrize("share", [True, False])
def test_gathered_hidden_states_are_the_lm_head_inputs(share):
    """DelTA's h: the LM head's input (after the final norm) at the positions predicting each response token — so
    lm_head(h) gives the logits exactly, and h is the unpadded pass's last hidden state (``hidden_states[-1]``)."""
    tokenizer = word_tokenizer("a b c d e f".split())
    model = tiny_llama(tokenizer, hidden=32, layers=2, heads=2).eval()
    rows = [Row([5, 6, 7, 8, 9], [10, 11], 0, 0), Row([5, 6], [7, 8, 9, 10], 0, 1), Row([7], [5], 1, 0),
            Row([5, 6], [9], 1, 1), Row([5, 6, 7, 8, 9], [11, 10, 9], 2, 0)]  # fmt: skip
    batch = collate(rows, tokenizer.pad_token_id, share=share)
    with torch.no_grad():
        logits, hidden = response_outputs(model, batch, hidden=True)
        assert hidden.shape == (5, 4, 32) and torch.equal(logits, response_logits(model, batch))
        assert torch.allclose(model.lm_head(hidden), logits, rtol=0, atol=1e-6)
    logprobs, states = rows_logprobs_and_hidden(model, rows, tokenizer.pad_token_id, 0.7, 3, share=share)
    assert all(torch.equal(a, b) for a, b in zip(logprobs, rows_logprobs(model, rows, tokenizer.pad_token_id, 0.7, 3,
                                                                           share=share)))  # fmt: skip
    for k, (row, h) in enumerate(zip(rows, states)):
        with torch.no_grad():
            out = model(torch.tensor([row.prompt + row.response]), output_hidden_states=True)
        expected = out.hidden_states[-1][0, len(row.prompt) - 1 : -1]
        assert h.shape == (len(row.response), 32) and torch.allclose(h, expected, atol=1e-5)
        assert torch.allclose(model.lm_head(expected), out.logits[0, len(row.prompt) - 1 : -1], atol=1e-6)
        assert torch.allclose(h, hidden[k, : len(row.response)], atol=1e-5)  # micro-batches of 3, or all 5 at once
    assert not model.get_output_embeddings()._forward_pre_hooks  # the hook is gone after each pass


@pytest.mark.parametrize("micro", [1, 2])
def test_micro_batches_give_the_mini_batch_token_mean(micro):
    """Gradient accumulation over micro-batches equals one pass over the whole mini-batch (token-mean, Eq. 18)."""
    tokenizer = word_tokenizer("a b c d e f".split())
    rows = [Row([5, 6, 7], [8, 9, 10, 11], 0, 0), Row([5], [7], 1, 0), Row([6, 7], [8, 9], 1, 1)]
    advantages = torch.tensor([1.0, -2.0, 0.5])
    results = []
    for micro_batch in (micro, len(rows)):
        model = tiny_llama(tokenizer, hidden=32, layers=1, heads=2, seed=1)
        old = [lp + 0.05 for lp in rows_logprobs(model, rows, tokenizer.pad_token_id, 1.0, 8)]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(0)
        metrics = ppo_update(model, optimizer, rows, advantages, old, None, LossConfig(entropy_coef=0.01),
                             OptimConfig(mini_batch_size=8, micro_batch_size=micro_batch), 1.0, tokenizer.pad_token_id)  # fmt: skip
        results.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (m_micro, w_micro), (m_full, w_full) = results
    assert m_micro["loss"] == pytest.approx(m_full["loss"], rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w_micro, w_full))


def test_target_kl_ends_the_epoch_before_the_step_of_the_first_mini_batch_past_it():
    """optim.target_kl: mini-batches step until one reads an approximate KL above the target; that one and the rest
    take no step (Spinning Up's / SB3's early stop). Here the third row's θ_old is forced 2 nats above θ's."""
    tokenizer = word_tokenizer("a b c d e f".split())
    rows = [Row([5, 6, 7], [8, 9], 0, 0), Row([5], [7], 1, 0), Row([6, 7], [8, 9, 10], 2, 0)]
    advantages = torch.tensor([1.0, -2.0, 0.5])
    offsets = (0.0, 0.0, 2.0)
    outcomes = {}
    for target in (None, 0.5):
        model = tiny_llama(tokenizer, hidden=32, layers=1, heads=2, seed=1)
        before = [p.detach().clone() for p in model.parameters()]
        old = [lp + o for lp, o in zip(rows_logprobs(model, rows, tokenizer.pad_token_id, 1.0, 8), offsets)]
        torch.manual_seed(3)
        order = shuffled_by_prompt(rows)
        torch.manual_seed(3)
        metrics = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rows, advantages, old, None,
                             LossConfig(), OptimConfig(mini_batch_size=1, micro_batch_size=1, target_kl=target), 1.0,
                             tokenizer.pad_token_id)  # fmt: skip
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        outcomes[target] = (metrics["optimizer_steps"], metrics["stopped_early"], moved)
    assert outcomes[None] == (3, 0.0, True)
    steps_before = order.index(2)
    assert outcomes[0.5] == (steps_before, 1.0, steps_before > 0)


def test_a_target_kl_must_be_positive(tmp_path, actor_dir):
    with pytest.raises(ValueError, match="optim.target_kl must be > 0, got 0.0"):
        small_config(tmp_path / "run", actor_dir, "grpo", None, "optim.target_kl=0")


def test_reading_each_prompt_once_updates_exactly_like_reading_every_row():
    """The prompt-sharing update (each distinct prompt read once, its cache copied to its rows) gives the weights of
    the update that reads every row whole."""
    tokenizer = word_tokenizer("a b c d e f".split())
    rows = [Row([5, 6, 7], [8, 9, 10, 11], 0, 0), Row([5], [7], 1, 0), Row([5, 6, 7], [8, 10], 1, 1),
            Row([6, 7], [8, 9], 2, 0), Row([5, 6, 7], [11], 2, 1)]  # fmt: skip
    advantages = torch.tensor([1.0, -2.0, 0.5, 0.3, -1.0])
    weights = []
    for share in (True, False):
        model = tiny_llama(tokenizer, hidden=32, layers=2, heads=2, seed=1)
        old = [lp + 0.05 for lp in rows_logprobs(model, rows, tokenizer.pad_token_id, 1.0, 8, share=share)]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(0)
        ppo_update(model, optimizer, rows, advantages, old, None, LossConfig(entropy_coef=0.01),
                   OptimConfig(mini_batch_size=8, micro_batch_size=3), 1.0, tokenizer.pad_token_id, share)  # fmt: skip
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*weights))


# ---- LoRA, configuration, CLI, vocabulary check ------------------------------------------------------------------------
def test_lora_trains_adapters_only_and_kl_uses_the_base(tmp_path, actor_dir):
    lora = ("actor.lora_rank=4", "loss.kl_coef=0.1", "eval.every=0")
    config = small_config(tmp_path / "run", actor_dir, "grpo", None, *lora)
    records = train(config, make_env=ScriptedOutcomes())
    assert records[-1]["step"] == 2 and records[-1]["kl"] > 0.0  # π_ref is the base, not the adapted actor
    adapter = load_file(str(tmp_path / "run" / "checkpoints" / "step-2" / "actor" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapter.items())  # B starts at 0
    resumed = train(with_changes(config, run={"steps": 3}), resume="latest", make_env=ScriptedOutcomes())
    assert [r["step"] for r in resumed] == [1, 2, 3]


def test_presets_are_table_4():
    expected = {  # batch, G, max turns, max tokens per turn, KL, entropy, C
        "alfworld": (16, 8, 50, 1024, 0.01, 0.001, 16384),
        "papersearchqa": (512, 5, 6, 1024, 0.001, 0.0, 6144),
        "awm": (16, 16, 20, 2048, 0.001, 0.0, 16384),
    }
    for name, values in expected.items():
        c = resolve(name, overrides=["meter.path=/meter"])
        r = c.rollout
        assert (r.batch_size, r.group_size, r.max_turns, r.max_new_tokens) == values[:4]
        assert (c.loss.kl_coef, c.loss.entropy_coef, c.credit.failure_cost) == values[4:]
        assert (c.optim.lr, r.temperature, r.top_p, c.loss.clip_low, c.loss.clip_high) == (1e-6, 1.0, 1.0, 0.2, 0.28)
        assert (c.loss.dual_clip, c.credit.rho, c.credit.cap, c.loss.kl_estimator) == (3.0, 0.2, 5.0, "k3")


def test_overrides_are_typed_and_method_defaults_sit_below_them(tmp_path):
    c = resolve("alfworld", overrides=["algo.method=dapo", "optim.lr=1e-5", "rollout.max_prompt_tokens=none",
                                       "actor.lora_targets=[q_proj, k_proj]", "eval.greedy=false"])  # fmt: skip
    assert c.algo.dynamic_sampling and c.algo.estimator == "grpo" and c.loss.kl_coef == 0.0
    assert c.optim.lr == 1e-5 and c.rollout.max_prompt_tokens is None and c.actor.lora_targets == ("q_proj", "k_proj")
    assert c.eval.greedy is False
    assert resolve("alfworld", overrides=["algo.method=dapo", "loss.kl_coef=0.05"]).loss.kl_coef == 0.05
    (tmp_path / "c.yaml").write_text(dump(c))
    assert load(tmp_path / "c.yaml") == c and resolve(file=tmp_path / "c.yaml") == c
    for bad, message in [("optim.lrr=1", "unknown setting"), ("optim.lr=fast", "expected float"),
                         ("algo.method=ppo", "unknown"), ("credit.failure_cost=none", "failure_cost")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            resolve("alfworld", overrides=["meter.path=/m", bad])
    with pytest.raises(ValueError, match="meter.path"):
        resolve("alfworld")


def test_cli_prints_config_and_reports_bad_settings(capsys):
    assert train_main(["--preset", "household-tiny", "--method", "dapo", "--set", "run.steps=7", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "method: dapo" in printed and "steps: 7" in printed and "kl_coef: 0.0" in printed
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--preset", "household-tiny", "--method", "deltattg"])
    assert exit_info.value.code == 2 and "meter.path" in capsys.readouterr().err
    for preset, env in [("papersearchqa", "search"), ("awm", "awm")]:  # a paper preset prints without a meter
        assert train_main(["--preset", preset, "--print-config"]) == 0
        printed = capsys.readouterr()
        assert f"  name: {env}\n" in printed.out and "eval_split: test" in printed.out
        assert "give --meter DIR to train" in printed.err


def test_tokenizer_missing_prompt_words_is_refused():
    env = easy_env()
    tokenizer = word_tokenizer(env.vocabulary())  # the environment's words, but not the prompt's ("Admissible", ...)
    policy = LMPolicy(tiny_llama(tokenizer, hidden=32, layers=1, heads=2), tokenizer, SamplingConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="Admissible"):
        demonstrations(policy, easy_env, env.tasks("train")[:1], 2)
