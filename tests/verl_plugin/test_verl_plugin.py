"""deltattg inside the real verl 0.9.1 (CPU, no Ray): the entry point, the agent loop, the advantage step.

Household episodes are played by ``EnvAgentLoop`` against a token-in/token-out server — a tiny random Llama, or a
server replaying scripted noisy-expert actions where the test needs both outcomes in a group — and written to the
(in-memory) TransferQueue by verl's own agent-loop postprocess; verl's ``_balance_batch`` pads and reorders the
rows; the deltattg trainer's advantage step runs verl's own ``_compute_advantage``. The per-token advantages that
come back must be those of the core estimator on the same trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import itertools
import json
import os
import shlex
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from deltattg.cli import main
from deltattg.credit import CreditConfig, get_estimator
from deltattg.credit.grpo import outcome_advantage
from deltattg.credit.layouts import StepLayoutError, meter_readings
from deltattg.credit.records import trajectory_batch
from deltattg.data.trajectory import parse_trajectory
from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.meter.endpoint import EndpointMeter
from deltattg.meter.loading import read_states
from deltattg.meter.oracle import OracleMeter
from deltattg.rollout.engine import Action, run_episodes, start_episode
from deltattg.rollout.policies import NoisyExpertPolicy
from deltattg.rollout.prompts import PromptConfig, episode_prompt
from deltattg.tiny import tiny_llama
from deltattg.train.actor import tiny_tokenizer
from deltattg.verl.agent_loop import EnvAgentLoop
from deltattg.verl.credit import STEP_FIELD, TOKENS_FIELD, TRAJECTORY_FIELD, MeterFailing, MeterWatch, VerlSettings
from deltattg.verl.tasks import TASK_FIELD, task_rows
from deltattg.verl import plugin
from deltattg.verl.estimators import EstimatorNameTaken, method_of, register_estimators
from deltattg.verl.trainer import DeltaTTGTrainer, settings_of

ENV = HouseholdConfig.short()
MAX_TURNS = 6
FAILURE_COST = 64.0


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(HouseholdEnv(ENV), PromptConfig(), MAX_TURNS)


def loop_config(prompt_length: int = 4096, response_length: int = 16, max_assistant_turns: int | None = None):
    multi_turn = {"tool_config_path": None, "max_assistant_turns": max_assistant_turns}
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length,
                                          "multi_turn": multi_turn}, "model": {"path": "dummy"}},
        "data": {},
    })  # fmt: skip


@functools.lru_cache
def dataset_rows(split: str) -> dict[str, dict]:
    """Task id -> its row's extra_info in the dataset `deltattg verl-tasks` writes."""
    rows = task_rows(lambda: HouseholdEnv(ENV), split)
    return {json.loads(row["extra_info"][TASK_FIELD])["task"]["id"]: row["extra_info"] for row in rows}


def dataset_extra_info(task) -> dict:
    return dataset_rows(task.split)[task.id]


def play(server, tokenizer, task, session: int, extra_info: dict | None = None, response_length: int = 16,
         max_assistant_turns: int | None = None, **options):
    """One episode of ``EnvAgentLoop`` (built inside the event loop, as verl's worker builds it); the loop's
    ``max_turns`` is ``MAX_TURNS`` unless ``options`` set it."""

    async def run():
        config = loop_config(response_length=response_length, max_assistant_turns=max_assistant_turns)
        loop = EnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                            processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                            **{"max_turns": MAX_TURNS, **options})  # fmt: skip
        row = extra_info if extra_info is not None else dataset_extra_info(task)
        return await loop.run({"temperature": 1.0}, extra_info=row, session_id=session)

    return asyncio.run(run())


class TinyModelServer:
    """Token-in/token-out generation by a tiny random Llama (what verl's vLLM / SGLang servers do)."""

    def __init__(self, tokenizer, seed: int = 0):
        self.model = tiny_llama(tokenizer, seed=seed).eval()
        self.tokenizer = tokenizer
        self.calls: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        self.calls.append(list(prompt_ids))
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), do_sample=True, max_new_tokens=sampling_params["max_tokens"],
                                      pad_token_id=self.tokenizer.pad_token_id, output_logits=True,
                                      return_dict_in_generate=True)  # fmt: skip
        ids = out.sequences[0, len(prompt_ids):]
        logprobs = torch.log_softmax(torch.stack(out.logits, 1)[0].float(), -1).gather(-1, ids[:, None])[:, 0]
        return TokenOutput(token_ids=ids.tolist(), log_probs=logprobs.tolist(),
                           extra_fields={"min_global_steps": 0, "max_global_steps": 0})  # fmt: skip


class ReplayServer:
    """A server that answers with scripted actions, in order (their token ids under the actor's tokenizer)."""

    def __init__(self, tokenizer, actions: list[str]):
        self.tokenizer = tokenizer
        self.actions = list(actions)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        ids = self.tokenizer(self.actions.pop(0), add_special_tokens=False)["input_ids"]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={"min_global_steps": 0,
                                                                                      "max_global_steps": 0})


# ---- the plugin --------------------------------------------------------------------------------------------------------
def test_the_entry_point_registers_estimators_trainer_and_agent_loop():
    points = importlib.metadata.entry_points(group="verl.plugins")
    assert any(p.value == "deltattg.verl.plugin" for p in points)
    methods = {"deltattg": "deltattg", "deltattg_robust": "deltattg_robust", "deltattg_pos": "pos", "deltattg_value": "value", "grpo_step": "grpo",
               "gigpo": "gigpo", "hgpo": "hgpo"}  # fmt: skip
    for name, method in methods.items():
        assert get_adv_estimator_fn(name).__name__ == f"deltattg_credit_{method}"
    # IGPO, A²TGPO, DelTA and CrEST read the actor's own forward passes: not offered to verl.
    assert not {"igpo", "a2tgpo", "delta", "crest"} & set(ADV_ESTIMATOR_REGISTRY)
    assert get_trainer_cls("deltattg") is DeltaTTGTrainer
    assert _agent_loop_registry["deltattg_env"]["_target_"] == "deltattg.verl.agent_loop.EnvAgentLoop"


def test_an_estimator_outside_the_deltattg_trainer_says_which_trainer_to_use():
    with pytest.raises(RuntimeError, match="trainer.v1.trainer_mode=deltattg"):
        get_adv_estimator_fn("deltattg")(torch.zeros(2, 3), torch.ones(2, 3), index=np.array(["a", "a"], dtype=object))


def test_settings_come_from_the_algorithm_section_and_unknown_keys_are_named():
    settings = VerlSettings.from_section({"failure_cost": 512, "rho": 0.3, "meter": "http://x/v1", "meter_model": "m"})
    assert settings.credit == CreditConfig(failure_cost=512, rho=0.3) and settings.meter_model == "m"
    with pytest.raises(ValueError, match="algorithm.deltattg.failure_costs: unknown setting"):
        VerlSettings.from_section({"failure_costs": 1})


# ---- the agent loop ----------------------------------------------------------------------------------------------------
def test_agent_loop_plays_household_with_a_tiny_model_server(tokenizer):
    task = HouseholdEnv(ENV).tasks("train")[0]
    server = TinyModelServer(tokenizer)
    outputs = play(server, tokenizer, task, session=1, max_tokens=6)
    record = outputs[-1].extra_fields[TRAJECTORY_FIELD]
    trajectory = parse_trajectory(record)
    assert len(outputs) == trajectory.num_steps == len(server.calls) >= 1
    for t, output in enumerate(outputs):
        assert output.extra_fields[STEP_FIELD] == t and output.response_mask == [1] * len(output.response_ids)
        assert output.extra_fields[TOKENS_FIELD] == len(output.response_ids)
        assert 1 <= len(output.response_ids) <= 6 and len(output.response_logprobs) == len(output.response_ids)
        assert output.reward_score == trajectory.reward
        assert output.prompt_ids == server.calls[t]
    actions = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    assert actions == [tokenizer.decode(o.response_ids, skip_special_tokens=True).strip() for o in outputs]
    # The record is the episode: replaying its actions in a fresh environment gives its observations and reward.
    replayed = run_episodes(lambda: HouseholdEnv(ENV), [task], _Replay(actions), max_turns=len(actions))[0]
    assert replayed.messages == trajectory.messages and replayed.reward == trajectory.reward
    # Step 0's prompt is what `deltattg train`'s actor reads at the initial state.
    text = tokenizer.apply_chat_template(episode_prompt(start_episode(HouseholdEnv(ENV), task, 0), PromptConfig()),
                                         tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert list(outputs[0].prompt_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]


class _Replay:
    name = "replay"

    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, episodes):
        return [Action(self.actions.pop(0)) for _ in episodes]


def test_agent_loop_names_a_dataset_row_without_a_task(tokenizer):
    with pytest.raises(ValueError, match="extra_info.deltattg_task must be"):
        asyncio.run(_run_without_task(tokenizer))


async def _run_without_task(tokenizer):
    config = loop_config()
    loop = EnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=tokenizer,
                        processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))  # fmt: skip
    return await loop.run({}, extra_info={"index": 3}, session_id=0)


# ---- the advantage step ------------------------------------------------------------------------------------------------
SESSIONS = 4  # rollout.n
EPSILONS = (0.0, 1.0, 0.0, 1.0)  # per session: expert (wins) / random (loses within MAX_TURNS) — both outcomes per group


def scripted_actions(task, epsilon: float, seed: int) -> list[str]:
    trajectory = run_episodes(lambda: HouseholdEnv(ENV), [task], NoisyExpertPolicy(epsilon, seed), max_turns=MAX_TURNS)[0]
    return [m["content"] for m in trajectory.messages if m["role"] == "assistant"]


def postprocess(outputs, uid: str, session: int, extra_info: dict) -> None:
    """verl's own AgentLoopWorkerTQ._agent_loop_postprocess: the outputs as TransferQueue rows."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.reward_loop_worker_handles = worker.teacher_client = worker.distillation_enabled = worker.processor = None
    asyncio.run(worker._agent_loop_postprocess(outputs, False, uid=uid, session_id=session, global_steps=1, index=0,
                                               extra_info=extra_info))  # fmt: skip


def collect_rows(tokenizer, tasks):
    """Play every (task, session) with scripted actions; write the rows; return the per-episode outputs."""
    episodes = {}
    for g, task in enumerate(tasks):
        for s, epsilon in enumerate(EPSILONS):
            outputs = play(ReplayServer(tokenizer, scripted_actions(task, epsilon, seed=10 * g + s)), tokenizer, task, s)
            postprocess(outputs, f"uid{g}", s, dataset_extra_info(task))
            episodes[(f"uid{g}", s)] = outputs
    return episodes


def trainer_for(method: str, tokenizer, meter, dp_size: int = 2) -> DeltaTTGTrainer:
    """The deltattg trainer with the state its advantage and balance steps use (verl's __init__ starts workers)."""
    trainer = object.__new__(DeltaTTGTrainer)
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": method, "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0,
                      "norm_adv_by_std_in_grpo": True, "deltattg": {"failure_cost": FAILURE_COST}},
        "actor_rollout_ref": {"rollout": {"n": SESSIONS}, "actor": {"ppo_mini_batch_size": 2}},
        "trainer": {"critic_warmup": 0},
    })  # fmt: skip
    trainer.deltattg_method = "grpo" if method == "grpo_step" else method
    trainer.deltattg = VerlSettings.from_section({"failure_cost": FAILURE_COST})
    trainer.deltattg_meter = meter
    trainer.deltattg_watch = MeterWatch(trainer.deltattg.max_failed_meter_steps)
    trainer.use_critic, trainer.global_steps, trainer.tokenizer = False, 1, tokenizer
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(dp_size))})
    return trainer


def core_credit(method: str, episodes, meter) -> dict[str, list[float]]:
    """What the core estimator gives each step of the same episodes: key -> the step's per-token advantages."""
    keys = sorted(episodes)
    trajectories = [parse_trajectory(episodes[k][-1].extra_fields[TRAJECTORY_FIELD]) for k in keys]
    step_tokens = [[len(o.response_ids) for o in episodes[k]] for k in keys]
    estimator = get_estimator(method)
    config = CreditConfig(failure_cost=FAILURE_COST)
    batch = trajectory_batch(trajectories, step_tokens, estimator, [k[0] for k in keys], with_meter=False)
    if estimator.needs_meter:
        readings, _ = read_states(meter, trajectories, estimator.queried(outcome_advantage(batch, config)).tolist())
        batch.meter = meter_readings(readings, batch.step_mask.shape[1])
    credit = estimator(batch, config)
    return {f"{uid}_{s}_{t}": [float(credit.step_advantages[i, t])] * n
            for i, (uid, s) in enumerate(keys) for t, n in enumerate(step_tokens[i])}  # fmt: skip


@pytest.mark.parametrize("method", ["deltattg", "grpo_step", "gigpo"])
def test_balanced_rows_get_the_core_credit(method, tokenizer, memory_tq):
    tasks = HouseholdEnv(ENV).tasks("train")[:2]
    episodes = collect_rows(tokenizer, tasks)
    assert {o[-1].reward_score for o in episodes.values()} == {0.0, 1.0}  # both outcomes: the credit is not all 0
    meter = OracleMeter(tokenizer)
    trainer = trainer_for(method, tokenizer, meter)
    batch = trainer._balance_batch(memory_tq.meta(), metrics={})
    real = [k for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding")]
    assert len(batch.keys) > len(real)  # verl added padding rows ...
    assert real != sorted(real, key=lambda k: (k.rsplit("_", 2)[0], int(k.rsplit("_", 2)[1]), int(k.rsplit("_", 2)[2])))
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)
    want = core_credit(trainer.deltattg_method, episodes, meter)
    assert sorted(real) == sorted(want)
    for key, tag in zip(batch.keys, batch.tags):
        got = memory_tq.rows[("train", key)]["advantages"].tolist()
        if tag.get("is_padding"):
            assert not any(got)  # ... which get no credit
        else:
            assert got == pytest.approx(want[key], abs=1e-6)
    assert metrics["deltattg/episodes"] == len(episodes)
    if method == "deltattg":
        assert metrics["deltattg/credit/redistributed"] > 0 and metrics["deltattg/meter_errors"] == 0


def test_robust_credit_on_verl_rows_equals_deltattg_credit_on_the_same_records(tokenizer, memory_tq, tmp_path):
    """``algorithm.adv_estimator=deltattg_robust`` — the recommended method — on verl's balanced rows gives each step
    what ``deltattg credit --method deltattg_robust`` writes for the same trajectory records and meter readings."""
    tasks = HouseholdEnv(ENV).tasks("train")[:4]
    episodes = collect_rows(tokenizer, tasks)
    meter = OracleMeter(tokenizer)
    trainer = trainer_for("deltattg_robust", tokenizer, meter)
    metrics: dict = {}
    trainer._compute_advantage(trainer._balance_batch(memory_tq.meta(), metrics={}), metrics)
    assert metrics["deltattg/credit/redistributed"] > 0  # the trust is not 0: robust credit is not GRPO here
    keys = sorted(episodes)
    records = []
    for uid, s in keys:
        record = dict(episodes[(uid, s)][-1].extra_fields[TRAJECTORY_FIELD])
        trajectory = parse_trajectory(record)
        (readings,), _ = read_states(meter, [trajectory], [True])
        record |= {"group": uid, "step_tokens": [len(o.response_ids) for o in episodes[(uid, s)]],
                   "meter": [None if r is None else r.to_json() for r in readings]}  # fmt: skip
        records.append(record)
    (tmp_path / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["credit", str(tmp_path / "pool.jsonl"), "--method", "deltattg_robust", "--failure-cost",
                 str(FAILURE_COST), "--out", str(tmp_path / "credit.jsonl")]) == 0  # fmt: skip
    written = [json.loads(line) for line in (tmp_path / "credit.jsonl").read_text().splitlines()]
    for (uid, s), record in zip(keys, written, strict=True):
        for t, advantage in enumerate(record["step_advantages"]):
            got = memory_tq.rows[("train", f"{uid}_{s}_{t}")]["advantages"].tolist()
            assert got == pytest.approx([advantage] * len(got), abs=1e-5)


def test_rows_that_do_not_line_up_with_the_record_are_an_error_naming_the_episode(tokenizer, memory_tq):
    episodes = collect_rows(tokenizer, HouseholdEnv(ENV).tasks("train")[:1])
    trainer = trainer_for("deltattg", tokenizer, OracleMeter(tokenizer))
    batch = memory_tq.meta()
    long_episode = max(episodes, key=lambda k: len(episodes[k]))
    dropped = f"{long_episode[0]}_{long_episode[1]}_0"  # a lost step row: the record has one action more
    keep = [i for i, k in enumerate(batch.keys) if k != dropped]
    batch = batch.select_samples(keep) if hasattr(batch, "select_samples") else type(batch)(
        keys=[batch.keys[i] for i in keep], tags=[batch.tags[i] for i in keep], partition_id=batch.partition_id)
    with pytest.raises(StepLayoutError, match=f"episode {long_episode[0]}_{long_episode[1]}"):
        trainer._compute_advantage(batch, {})
    # A row whose deltattg_step disagrees with its key (another agent loop's rows, a shifted index).
    key = f"{long_episode[0]}_{long_episode[1]}_1"
    memory_tq.rows[("train", key)]["extra_fields"][STEP_FIELD] = 0
    with pytest.raises(StepLayoutError, match="has deltattg_step=0 but its key says step 1"):
        trainer._compute_advantage(memory_tq.meta(), {})


def two_rows_of_one_group_with_different_lengths(memory_tq) -> tuple[str, str]:
    """Two keys of the same prompt group whose actions have different numbers of tokens."""
    lengths = {key: len(row["response_mask"]) for (_, key), row in memory_tq.rows.items()}
    for a, b in itertools.combinations(sorted(lengths), 2):
        if a.rsplit("_", 2)[0] == b.rsplit("_", 2)[0] and lengths[a] != lengths[b]:
            return a, b
    raise AssertionError("every row of the group has the same length")


def test_rows_swapped_within_a_group_are_an_error_naming_the_row(tokenizer, memory_tq):
    collect_rows(tokenizer, HouseholdEnv(ENV).tasks("train")[:1])
    a, b = two_rows_of_one_group_with_different_lengths(memory_tq)
    first, second = memory_tq.rows[("train", a)], memory_tq.rows[("train", b)]
    tensors = set(first) - {"extra_fields"}

    def swap():  # verl's tensors of a reach b's key and back: the uid is the same
        for field in tensors:
            first[field], second[field] = second[field], first[field]

    swap()
    trainer = trainer_for("grpo_step", tokenizer, None)
    with pytest.raises(StepLayoutError, match=r"row '(%s|%s)' arrived with a response of \d+ tokens but its action "
                                              r"has \d+: rows and keys are out of step" % (a, b)):  # fmt: skip
        trainer._compute_advantage(memory_tq.meta(), {})
    swap()
    del first["extra_fields"][TOKENS_FIELD]  # rows of an agent loop that does not say how long each action is
    with pytest.raises(StepLayoutError, match=f"row '{a}' has deltattg_tokens=None"):
        trainer._compute_advantage(memory_tq.meta(), {})


def test_the_outcome_is_the_records_reward_not_the_shaped_token_rewards(tokenizer, memory_tq):
    """Token-level rewards that differ from the environment's (as a KL penalty makes them) do not move the credit."""
    episodes = collect_rows(tokenizer, HouseholdEnv(ENV).tasks("train")[:2])
    for i, row in enumerate(memory_tq.rows.values()):
        row["rm_scores"] = row["rm_scores"] - 0.05 * (i % 7)  # a different penalty on every row
    trainer = trainer_for("grpo_step", tokenizer, None)
    trainer._compute_advantage(trainer._balance_batch(memory_tq.meta(), metrics={}), {})
    for key, want in core_credit("grpo", episodes, None).items():
        assert memory_tq.rows[("train", key)]["advantages"].tolist() == pytest.approx(want, abs=1e-6)


def test_the_trainer_refuses_a_kl_penalty_in_the_reward():
    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "deltattg"}},
                               "algorithm": {"adv_estimator": "grpo_step", "use_kl_in_reward": True}})  # fmt: skip
    with pytest.raises(ValueError, match="use_kl_in_reward=true.*actor_rollout_ref.actor.use_kl_loss=true"):
        DeltaTTGTrainer(config)


def foreign_gigpo(token_level_rewards, response_mask, **_):
    """Another plugin's estimator registered under a name deltattg uses (verl-agent registers a 'gigpo')."""
    return token_level_rewards, token_level_rewards


def test_an_estimator_name_verl_already_holds_is_refused(monkeypatch):
    monkeypatch.setitem(ADV_ESTIMATOR_REGISTRY, "gigpo", foreign_gigpo)
    with pytest.raises(EstimatorNameTaken, match=r"already holds gigpo \(held by .*foreign_gigpo\)"):
        register_estimators()
    assert get_adv_estimator_fn("gigpo") is foreign_gigpo  # left to its owner ...
    assert get_adv_estimator_fn("deltattg").__name__ == "deltattg_credit_deltattg"  # ... the free names are ours
    with pytest.warns(UserWarning, match="deltattg's verl plugin: .*gigpo"):  # verl hides a plugin's errors
        importlib.reload(plugin)
    assert "gigpo" not in plugin.ESTIMATORS and "deltattg" in plugin.ESTIMATORS
    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "deltattg"}},
                               "algorithm": {"adv_estimator": "gigpo", "use_kl_in_reward": False}})  # fmt: skip
    with pytest.raises(ValueError, match="algorithm.adv_estimator=gigpo: .*foreign_gigpo.*refuses to run it"):
        DeltaTTGTrainer(config)  # the trainer would prepare deltattg's gigpo while verl ran the other one
    assert method_of("grpo") is None  # verl's own names stay verl's


class _FailingMeterHandler(BaseHTTPRequestHandler):
    """A meter endpoint that answers every request with a server error."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(500)
        self.end_headers()
        self.wfile.write(b"meter down")

    def log_message(self, *args):
        pass


class _RaisingMeter:
    meter_id = "raising"

    def score(self, histories):
        raise ConnectionError("meter process died")


@contextlib.contextmanager
def failing_meter(fault: str):
    """A meter that fails: an endpoint on loopback answering HTTP 500 (``"http 500"``), or one that raises."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingMeterHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield (EndpointMeter(f"http://127.0.0.1:{server.server_address[1]}/v1", "meter", timeout_s=5.0)
               if fault == "http 500" else _RaisingMeter())  # fmt: skip
    finally:
        server.shutdown()


@pytest.mark.parametrize("fault", ["http 500", "raises"])
def test_a_failing_meter_makes_the_groups_keep_their_grpo_advantages(fault, tokenizer, memory_tq):
    episodes = collect_rows(tokenizer, HouseholdEnv(ENV).tasks("train")[:1])
    with failing_meter(fault) as meter:
        trainer = trainer_for("deltattg", tokenizer, meter)
        metrics: dict = {}
        trainer._compute_advantage(memory_tq.meta(), metrics)
    grpo = core_credit("grpo", episodes, None)
    for key, want in grpo.items():
        assert memory_tq.rows[("train", key)]["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    assert metrics["deltattg/credit/invalid_group"] == len(episodes)  # every trajectory has A ≠ 0 here
    assert metrics["deltattg/meter_errors"] == (1.0 if fault == "raises" else 0.0)


@pytest.mark.parametrize("fault", ["http 500", "raises"])
def test_a_meter_that_keeps_failing_stops_the_run(fault, tokenizer, memory_tq):
    """``max_failed_meter_steps`` consecutive steps without a valid reading stop training (it would be GRPO under
    DeltaTTG's name); a step with valid readings in between starts the count again."""
    collect_rows(tokenizer, HouseholdEnv(ENV).tasks("train")[:1])
    with failing_meter(fault) as failing:
        trainer = trainer_for("deltattg", tokenizer, failing)
        trainer.deltattg_watch = MeterWatch(2)
        trainer._compute_advantage(memory_tq.meta(), {})  # one failed step: training goes on
        trainer.deltattg_meter = OracleMeter(tokenizer)
        trainer._compute_advantage(memory_tq.meta(), {})  # a good step: the count starts again
        trainer.deltattg_meter = failing
        trainer._compute_advantage(memory_tq.meta(), {})
        with pytest.raises(MeterFailing, match="2 consecutive training steps .*max_failed_meter_steps"):
            trainer._compute_advantage(memory_tq.meta(), {})


def test_a_method_that_needs_the_failure_cost_is_refused_when_the_trainer_is_built():
    config = OmegaConf.create({"algorithm": {"adv_estimator": "deltattg_robust", "use_kl_in_reward": False,
                                             "deltattg": {"meter": "oracle"}},
                               "trainer": {"v1": {"trainer_mode": "deltattg"}}})  # fmt: skip
    with pytest.raises(ValueError, match="algorithm.deltattg.failure_cost"):
        DeltaTTGTrainer(config)
    with pytest.raises(ValueError, match="max_failed_meter_steps: a whole number"):
        VerlSettings.from_section({"failure_cost": 64, "max_failed_meter_steps": -1})


def test_the_verl_tasks_parquet_reaches_the_agent_loop_through_verls_dataset(tokenizer, tmp_path):
    out = tmp_path / "household.parquet"
    assert main(["verl-tasks", "--env", "household", "--short", "--split", "valid_seen", "--limit", "3",
                 "--out", str(out)]) == 0  # fmt: skip
    dataset = RLHFDataset(str(out), tokenizer, OmegaConf.create({"cache_dir": str(tmp_path / "cache"),
                                                                 "max_prompt_length": 4096}))  # fmt: skip
    assert len(dataset) == 3
    row = dataset[1]
    assert row["agent_name"] == "deltattg_env"
    task = HouseholdEnv(ENV).tasks("valid_seen")[1]
    outputs = play(ReplayServer(tokenizer, scripted_actions(task, 0.0, seed=0)), tokenizer, task, 0,
                   extra_info=row["extra_info"])  # fmt: skip
    record = parse_trajectory(outputs[-1].extra_fields[TRAJECTORY_FIELD])
    assert record.group == task.id and record.success and record.extra["task"]["split"] == "valid_seen"


@pytest.mark.parametrize("yaml_turns, verl_turns, played", [(None, 2, 2), (3, 2, 3), (None, None, ENV.max_steps)])
def test_an_episode_stops_at_the_agent_loop_yaml_turns_else_at_verls_max_assistant_turns(tokenizer, yaml_turns,
                                                                                          verl_turns, played):
    """The agent-loop YAML's ``max_turns`` wins; without it verl's ``multi_turn.max_assistant_turns`` (train.sh's
    per-setting turns) ends the episode; without either, the environment's step limit does."""
    task = HouseholdEnv(ENV).tasks("valid_seen")[0]
    actions = ["look"] * ENV.max_steps  # never completes the task
    outputs = play(ReplayServer(tokenizer, actions), tokenizer, task, 0, max_assistant_turns=verl_turns,
                   max_turns=yaml_turns)  # fmt: skip
    assert len(outputs) == played


def documented_settings(setting: str) -> dict[str, str]:
    """The row of docs/verl.md's launch-settings table for ``setting``, by column."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| setting | batch × G |"))
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    row = next(line for line in lines[at + 2:] if line.startswith(f"| `{setting}` |"))
    return dict(zip(columns, (c.strip() for c in row.strip("|").split("|"))))


@pytest.mark.parametrize("method, setting", [("deltattg", "alfworld"), ("deltattg", "papersearch"),
                                             ("gigpo", "papersearch"), ("grpo_step", "alfworld")])  # fmt: skip
def test_the_launch_recipe_composes_with_verls_config(method, setting, tmp_path):
    """recipes/verl/train.sh's overrides are keys of verl's own config, the deltattg section parses, and the
    composed config holds what docs/verl.md's table says of the setting (so a changed number there fails here)."""
    script = Path(__file__).resolve().parents[2] / "recipes" / "verl" / "train.sh"
    env = {**os.environ, "DRY_RUN": "1", "METHOD": method, "SETTING": setting, "OUT": str(tmp_path)}
    printed = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
    command = shlex.split(printed.strip().splitlines()[-1])
    overrides = command[command.index("verl.trainer.main_ppo") + 1:]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.trainer.v1.trainer_mode == "deltattg" and get_trainer_cls("deltattg") is DeltaTTGTrainer
    assert method_of(config.algorithm.adv_estimator) is not None
    settings = settings_of(config.algorithm)
    doc = documented_settings(setting)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert doc["batch × G"] == f"{config.data.train_batch_size} × {rollout.n}"
    assert int(doc["turns"]) == rollout.multi_turn.max_assistant_turns
    assert int(doc["tokens / turn"]) == config.data.max_response_length
    assert float(doc["KL"]) == actor.kl_loss_coef and actor.use_kl_loss
    assert float(doc["entropy"]) == actor.entropy_coeff
    assert doc["clip (low / high)"] == f"{actor.clip_ratio_low:g} / {actor.clip_ratio_high:g}"
    assert float(doc["dual clip"]) == actor.clip_ratio_c and float(doc["lr"]) == actor.optim.lr
    if method == "deltattg":
        assert settings.credit.failure_cost == int(doc["C"])
        assert settings.meter.endswith(":8100/v1") and config.trainer.n_gpus_per_node == 7
    else:
        assert settings.meter is None and config.trainer.n_gpus_per_node == 8


def test_a_search_task_reaches_the_agent_loop_and_is_judged_there(tmp_path):
    """The search environment on verl: its verl-tasks row rebuilds the environment (questions and corpus by
    absolute path) in the agent loop, which plays scripted replies against the local BM25 corpus."""
    pytest.importorskip("bm25s")
    from deltattg.envs.search import SearchEnv

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in [
        {"id": "p1", "contents": "Hamlet\nHamlet is a tragedy written by William Shakespeare."},
        {"id": "p2", "contents": "Melbourne\nMelbourne was founded in 1835."}]))  # fmt: skip
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "train.jsonl").write_text(json.dumps({"question": "Who wrote Hamlet?",
                                                            "golden_answers": ["William Shakespeare"]}) + "\n")
    out = tmp_path / "search.parquet"
    assert main(["verl-tasks", "--env", "search", "--data", str(tmp_path / "q"), "--corpus", str(corpus),
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    env = SearchEnv(tmp_path / "q", corpus=corpus)
    words = tiny_tokenizer(env, PromptConfig(), MAX_TURNS)
    dataset = RLHFDataset(str(out), words, OmegaConf.create({"cache_dir": str(tmp_path / "cache"),
                                                             "max_prompt_length": 4096}))  # fmt: skip
    task = env.tasks("train")[0]
    actions = ["<search> Hamlet tragedy </search>", "<answer> William Shakespeare </answer>"]
    outputs = play(ReplayServer(words, actions), words, task, 0, extra_info=dataset[0]["extra_info"])
    record = parse_trajectory(outputs[-1].extra_fields[TRAJECTORY_FIELD])
    assert record.success and record.reward == 1.0 and len(outputs) == 2
    assert any("Doc 1(Title: Hamlet) Hamlet is a tragedy" in m["content"] for m in record.messages if m["role"] == "user")


def test_an_awm_task_reaches_the_agent_loop_and_its_verifier_decides(tmp_path):
    """The AWM environment on verl: a verl-tasks row rebuilds it in the agent loop, which starts the scenario's MCP
    server, plays the gold calls (a byte-level tokenizer: JSON round-trips) and gets the verifier's verdict."""
    pytest.importorskip("fastapi_mcp")
    from deltattg.envs.awm import AWMEnv
    from deltattg.envs.awm.examples import write_examples
    from deltattg.tiny import byte_tokenizer

    write_examples(tmp_path / "awm")
    out = tmp_path / "awm.parquet"
    assert main(["verl-tasks", "--env", "awm", "--data", str(tmp_path / "awm"), "--split", "notes", "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    tokenizer = byte_tokenizer()
    dataset = RLHFDataset(str(out), tokenizer, OmegaConf.create({"cache_dir": str(tmp_path / "cache"),
                                                                 "max_prompt_length": 8192}))  # fmt: skip
    env = AWMEnv(tmp_path / "awm")
    task = env.tasks("notes")[1]  # archive the two drafts: three gold calls, then the answer
    env.reset(task)
    actions = []
    while not (result := env.step(action := env.expert_action())).done:
        actions.append(action)
    actions.append(action)
    env.close()
    assert result.won
    outputs = play(ReplayServer(tokenizer, actions), tokenizer, task, 0, extra_info=dataset[1]["extra_info"],
                   response_length=512)
    record = parse_trajectory(outputs[-1].extra_fields[TRAJECTORY_FIELD])
    assert record.group == "notes/1" and record.success and record.reward == 1.0 and len(outputs) == len(actions)
