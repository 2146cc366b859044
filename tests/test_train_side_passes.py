"""Side passes (``deltattg.train.side_passes``): an estimator's record names its pass, the trainer calls it at the
three points of the step with what each needs, its per-token advantages reach the loss, its state goes into every
checkpoint and comes back on resume; records that read what only the trainer computes must name a pass."""

from __future__ import annotations

import pytest
import torch
from test_train import ScriptedOutcomes, actor_dir, small_config, without_timing  # noqa: F401 (fixtures)

from deltattg.credit import CreditConfig, Estimator, Reads, get_estimator
from deltattg.credit import registry
from deltattg.credit.grpo import grpo
from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.loss import policy_loss
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig
from deltattg.tiny import tiny_llama
from deltattg.train import resolve, train
from deltattg.train import trainer as trainer_module
from deltattg.train.actor import tiny_tokenizer
from deltattg.train.answers import AnswerLogprobs
from deltattg.train.side_passes import (
    HiddenStateWeights,
    Setup,
    SidePass,
    UpdateBatch,
    estimator_pass,
    token_weighted_advantages,
)
from deltattg.train.teacher import TeacherWeights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- a probe: a side pass that records what the trainer hands it ---------------------------------------------------
class Probe(SidePass):
    """Records each hook's call; its per-token advantages are all 0 (so the loss must see zeros); its state is the
    number of hook calls so far."""

    phase = "credit"
    built: list["Probe"] = []

    def __init__(self, setup: Setup):
        self.setup, self.calls, self.loaded = setup, [], None
        Probe.built.append(self)

    def before_credit(self, trajectories):
        assert all(t.answer_logprobs is None for t in trajectories)
        self.calls.append(("before", len(trajectories)))
        return {"probe/before": len(trajectories)}

    def after_credit(self, step, trajectories):
        self.calls.append(("after", step))
        return {"probe/after": step}

    def token_advantages(self, batch: UpdateBatch):
        assert len(batch.old_logprobs) == len(batch.rows) == len(batch.advantages)
        assert batch.hidden is None and batch.per_token is None  # no pass read hidden states or set per-token values
        batch.per_token = [torch.zeros(len(row.response)) for row in batch.rows]
        self.calls.append(("tokens", len(batch.rows)))
        return {"probe/rows": len(batch.rows)}

    def state_dict(self):
        return {"probe_calls": len(self.calls)}

    def load_state_dict(self, state):
        self.loaded = state["probe_calls"]


def probe_pass(setup: Setup) -> Probe:
    return Probe(setup)


@pytest.fixture
def probe(monkeypatch):
    """An estimator ``probe`` (GRPO's credit) whose record names :func:`probe_pass`, registered for one test."""
    record = Estimator("probe", grpo, "GRPO with a probe side pass", side_pass=f"{__name__}:probe_pass")
    monkeypatch.setitem(registry._ESTIMATORS, "probe", record)
    Probe.built.clear()
    return record


def test_the_trainer_calls_the_records_side_pass_at_each_point_and_checkpoints_its_state(tmp_path, actor_dir, probe):
    seen = []  # every token advantage the loss got
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "policy_loss", lambda *a, **k: seen.append(a[2]) or policy_loss(*a, **k))
        records = train(small_config(tmp_path / "a", actor_dir, "probe", None, "run.steps=3", "run.save_every=1"),
                        make_env=ScriptedOutcomes())  # fmt: skip
    (run,) = Probe.built
    assert run.setup.estimator is probe and run.setup.meter is None and run.setup.config.algo.method == "probe"
    assert [c[0] for c in run.calls] == ["before", "after", "tokens"] * 3
    assert [c[1] for c in run.calls if c[0] == "after"] == [1, 2, 3]  # the step number
    for r in records[1:]:
        assert r["probe/before"] == r["train/trajectories"] and r["probe/after"] == r["step"]
        assert r["probe/rows"] == r["train/rows"] and r["advantage/abs_mean"] > 0
    assert seen and all(not a.any() for a in seen)  # the pass's per-token advantages, not the rows', reached the loss
    state = torch.load(tmp_path / "a" / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=True)
    assert state["probe_calls"] == 6

    Probe.built.clear()
    resumed = train(small_config(tmp_path / "a", actor_dir, "probe", None, "run.steps=3", "run.save_every=1"),
                    resume=tmp_path / "a" / "checkpoints" / "step-2", make_env=ScriptedOutcomes())  # fmt: skip
    (again,) = Probe.built
    assert again.loaded == 6 and [c[0] for c in again.calls] == ["before", "after", "tokens"]
    assert [without_timing(r) for r in resumed] == [without_timing(r) for r in records]


def test_a_side_pass_that_cannot_be_loaded_is_refused_naming_the_estimator(tmp_path, actor_dir, monkeypatch):
    record = Estimator("probe", grpo, "", side_pass=f"{__name__}:no_such_pass")
    monkeypatch.setitem(registry._ESTIMATORS, "probe", record)
    with pytest.raises(ValueError, match=r"estimator 'probe': its side pass '.*:no_such_pass' cannot be loaded"):
        train(small_config(tmp_path / "a", actor_dir, "probe", None), make_env=ScriptedOutcomes())
    assert not (tmp_path / "a" / "run.json").exists()  # refused at setup, before the run's folder was written


# ---- the records ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reads", [Reads.ANSWER_PROBS, Reads.TEACHER_LOGPROBS])
def test_a_record_that_reads_what_the_trainer_computes_must_name_its_side_pass(reads):
    weights = {"teacher_weights": lambda *args: args[1]} if reads is Reads.TEACHER_LOGPROBS else {}
    with pytest.raises(ValueError, match="which the trainer computes in a side pass"):
        Estimator("x", grpo, "", reads=frozenset({reads}), **weights)
    assert Estimator("x", grpo, "", reads=frozenset({reads}), side_pass="pkg.mod:factory", **weights).side_pass


@pytest.mark.parametrize("spec", ["pkg.mod", "pkg.mod:", ":factory", "pkg mod:factory", "pkg.mod:a.b"])
def test_a_side_pass_is_named_module_colon_function(spec):
    with pytest.raises(ValueError, match="side_pass must be 'module:function'"):
        Estimator("x", grpo, "", side_pass=spec)


def household_setup(method: str) -> Setup:
    env = HouseholdEnv(HouseholdConfig.short())
    tokenizer = tiny_tokenizer(env, PromptConfig(), 3)
    policy = LMPolicy(tiny_llama(tokenizer, hidden=32, layers=1, heads=2, seed=1).eval(), tokenizer,
                      SamplingConfig(max_new_tokens=4), PromptConfig(), name="actor")  # fmt: skip
    config = resolve("household-tiny", overrides=[f"algo.method={method}", "rollout.temperature=0.7",
                                                  "optim.micro_batch_size=5", "credit.crest_epsilon=0.3"])  # fmt: skip
    return Setup(config, get_estimator(method), policy, env, env.tasks("train")[:2])


@pytest.mark.parametrize("method, kind", [("igpo", AnswerLogprobs), ("a2tgpo", AnswerLogprobs),
                                          ("delta", HiddenStateWeights), ("crest", TeacherWeights)])  # fmt: skip
def test_each_registered_side_pass_is_built_from_the_runs_setup(method, kind):
    setup = household_setup(method)
    built = estimator_pass(setup)
    assert type(built) is kind and built.phase in trainer_module.PHASES
    assert built.reads_hidden_states == (method == "delta")
    if isinstance(built, AnswerLogprobs):
        assert (built.method, built.temperature, built.micro_batch_size) == (method, 0.7, 5)
    elif isinstance(built, TeacherWeights):
        assert built.estimator is setup.estimator and built.credit.crest_epsilon == 0.3
        assert (built.teacher.temperature, built.teacher.micro_batch_size) == (0.7, 5)
    assert estimator_pass(household_setup("grpo")) is None


def test_delta_scales_per_token_advantages_another_pass_set():
    """Per-token advantages equal to the rows' repeated give the rows' A·ω exactly; doubled ones give it doubled."""
    torch.manual_seed(0)
    lengths = [3, 2, 4]
    advantages = torch.tensor([1.0, -0.5, 2.0])
    logprobs = [-torch.rand(n) for n in lengths]
    hidden = [torch.randn(n, 8) for n in lengths]
    estimator, config = get_estimator("delta"), CreditConfig()
    rows, metrics = token_weighted_advantages(estimator, config, advantages, logprobs, hidden)
    repeated = [torch.full((n,), a.item()) for n, a in zip(lengths, advantages)]
    same, same_metrics = token_weighted_advantages(estimator, config, advantages, logprobs, hidden, per_token=repeated)
    assert all(torch.equal(x, y) for x, y in zip(rows, same)) and metrics == same_metrics
    doubled, _ = token_weighted_advantages(estimator, config, advantages, logprobs, hidden,
                                           per_token=[2 * r for r in repeated])  # fmt: skip
    assert all(torch.allclose(2 * x, y) for x, y in zip(rows, doubled))  # ω: |A|-weighted means, scale-free


def test_a_phase_outside_the_timers_phases_is_refused():
    timer = trainer_module.PhaseTimer(torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown phase 'teachers'"):
        with timer("teachers"):
            pass
