"""The regression meter: one pass equals prefix-by-prefix scoring; a tiny model learns Token-to-Go."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from conftest import make_tiny_tokenizer
from deltattg.data.labels import remaining_sums
from deltattg.meter.regression import (RegressionConfig, RegressionMeter, decision_blocks, plan_windows, make_head,
                                       shared_prefix_groups)
from deltattg.meter.train_regression import (OnPolicyRefresh, RegressionTrainConfig, _row_of, consecutive_pairs, step_pairs,
                                             train_head_on_features, train_regression_meter, trajectory_examples)

WORDS = "system user assistant tool goal go to take put the mug cup done next action interaction history of an agent".split()


def tiny_meter(max_length: int = 512, seed: int = 0, pooling: str = "last", ensemble: int = 1,
               layer: int | None = None) -> RegressionMeter:
    torch.manual_seed(seed)
    tokenizer = make_tiny_tokenizer(WORDS)
    backbone = LlamaModel(LlamaConfig(vocab_size=len(tokenizer), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024))
    config = RegressionConfig(backbone="tiny", max_length=max_length, head_hidden=32, pooling=pooling,
                              ensemble=ensemble, layer=layer)
    return RegressionMeter(backbone, tokenizer, config).eval()


def episode(goal: int, actions: int, rng: random.Random) -> list[dict]:
    """The first message says how many actions the task takes; each observation says how many are left."""
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"goal {goal}"}]
    for t in range(actions):
        messages += [{"role": "assistant", "content": rng.choice(["go to the mug", "take the cup", "go"])},
                     {"role": "user", "content": f"next {max(goal - t - 1, 0)}"}]
    return messages


def prefixes(messages):
    cut = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [messages[:i] for i in cut] + [messages]


@pytest.mark.parametrize("pooling", ["last", "last+mean"])
@pytest.mark.parametrize("max_length", [512, 40])
def test_one_pass_equals_prefix_by_prefix(max_length, pooling):
    meter = tiny_meter(max_length, pooling=pooling)
    rng = random.Random(0)
    trajectories = [episode(3, 5, rng), episode(2, 1, rng), episode(4, 0, rng)]
    one_pass = meter.score_trajectories(trajectories)
    for messages, readings in zip(trajectories, one_pass):
        single = meter.score(prefixes(messages))
        assert len(readings) == len(single) == sum(m["role"] == "assistant" for m in messages) + 1
        assert [r.logit for r in readings] == pytest.approx([r.logit for r in single], abs=1e-4)
    if max_length == 40:  # the long trajectory needed several windows, yet still agrees
        assert len(meter.windows(trajectories[0])) > 1


def test_a_feature_cache_reads_as_the_backbone_and_is_shared_by_meters_with_other_heads(tmp_path):
    """``feature_cache``: the first reading computes and stores the windows' features, a later meter on the same
    backbone (another head) reads them from the file, not from its backbone, and each reads what it would alone."""
    rng = random.Random(1)
    trajectories = [episode(3, 4, rng), episode(2, 2, rng)]
    first, second = tiny_meter(60, seed=0), tiny_meter(60, seed=0)
    torch.manual_seed(9)
    second.head = make_head(48, second.config)  # same backbone weights and spec, another head
    plain = [second.score_trajectories(trajectories), first.score_trajectories(trajectories)]
    first.feature_cache = second.feature_cache = tmp_path / "features.pt"
    cached_first = first.score_trajectories(trajectories)
    assert first.feature_cache.is_file()
    with torch.no_grad():  # the file, not the backbone, is what the second meter reads
        for p in second.backbone.parameters():
            p.zero_()
    cached_second = second.score_trajectories(trajectories)
    for cached, alone in ((cached_first, plain[1]), (cached_second, plain[0])):
        assert [r.logit for row in cached for r in row] == pytest.approx([r.logit for row in alone for r in row], abs=1e-4)
    assert [r.logit for r in cached_first[0]] != pytest.approx([r.logit for r in cached_second[0]], abs=1e-3)


@pytest.mark.parametrize("pooling,layer,max_length", [("last", None, 512), ("last+mean", None, 512),
                                                     ("last+mean", 1, 512), ("last", None, 60)])
def test_candidates_sharing_a_history_read_as_each_alone(pooling, layer, max_length):
    meter = tiny_meter(max_length, seed=4, pooling=pooling, layer=layer)
    base = episode(4, 3, random.Random(2))
    candidates = [[*base, {"role": "assistant", "content": action}, {"role": "user", "content": observation}]
                  for action, observation in [("go", "next 2"), ("take the cup", "next 3 mug"), ("put the mug", "done")]]
    histories = [*candidates, base[:2], episode(2, 1, random.Random(3))]  # t = 0 and an unrelated history too
    windows = [meter.windows(h, steps=[sum(m["role"] == "assistant" for m in h)])[0] for h in histories]
    assert shared_prefix_groups(windows) == [[0, 1, 2], [3], [4]]
    together = meter.score(histories)
    alone = [meter.score([h])[0] for h in histories]
    assert [r.logit for r in together] == pytest.approx([r.logit for r in alone], abs=1e-4)
    assert [r.tokens_to_go for r in together] == pytest.approx([r.tokens_to_go for r in alone], rel=1e-3, abs=1)
    if max_length == 60:  # windowed: the shared part is the task block and the kept recent blocks
        assert 0 < windows[0].starts[0] < len(meter.windows(base)[-1].ids) + 1


def test_one_pass_reads_each_token_once():
    meter = tiny_meter(4096)
    messages = episode(3, 8, random.Random(1))
    windows = meter.windows(messages)
    blocks = decision_blocks(messages, meter.config.max_message_chars)
    own_length = len(meter.tokenizer("".join(blocks), add_special_tokens=False)["input_ids"])
    assert len(windows) == 1 and len(windows[0].ids) <= 1.05 * own_length
    assert windows[0].steps == list(range(9))


def test_windows_keep_the_task_block():
    blocks = [[0] * 5, [1] * 3, [2] * 3, [3] * 3]
    windows = plan_windows(blocks, 11)
    assert all(w.ids[:5] == [0] * 5 for w in windows)
    assert [w.steps for w in windows] == [[0, 1, 2], [3]]
    assert windows[1].ids == [0] * 5 + [2] * 3 + [3] * 3


def synthetic_set(n: int, seed: int):
    """TTG is determined by what the history shows: the latest message says how many actions remain, 4 tokens each."""
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        goal = rng.randint(1, 5)
        data.append((episode(goal, goal, rng), [4] * goal))
    return data


def synthetic_examples(meter: RegressionMeter) -> tuple[list, list]:
    """The windows and examples of ``synthetic_set(40, seed=0)``, every episode successful."""
    windows, examples = [], []
    for messages, tokens in synthetic_set(40, seed=0):
        w, e = trajectory_examples(meter, messages, True, tokens, len(windows))
        windows += w
        examples += e
    return windows, examples


def test_training_fits_token_to_go_better_than_the_mean(tmp_path):
    meter = tiny_meter()
    windows, examples = synthetic_examples(meter)
    config = RegressionTrainConfig(output_dir=str(tmp_path / "meter"), freeze_backbone=False, epochs=25, batch_size=8,
                                   lr_backbone=2e-3, lr_head=2e-3, save_every=10_000, progress=False)
    train_regression_meter(meter, windows, examples, config)
    test = synthetic_set(20, seed=1)
    predicted, truth = [], []
    for (messages, tokens), readings in zip(test, meter.score_trajectories([m for m, _ in test])):
        truth += remaining_sums(tokens)
        predicted += [r.tokens_to_go if r.can_complete else 0.0 for r in readings]
    truth_t = torch.log1p(torch.tensor(truth, dtype=torch.float))
    error = (torch.log1p(torch.tensor(predicted, dtype=torch.float)) - truth_t).abs().mean()
    baseline = (truth_t - truth_t.mean()).abs().mean()
    assert error < 0.3 * baseline, (error, baseline)


def test_frozen_backbone_trains_the_head_and_round_trips(tmp_path):
    meter = tiny_meter()
    windows, examples = [], []
    for messages, tokens in synthetic_set(20, seed=2):
        w, e = trajectory_examples(meter, messages, random.Random(len(windows)).random() < 0.7, tokens, len(windows))
        windows += w
        examples += e
    before = [p.clone() for p in meter.backbone.parameters()]
    out = tmp_path / "frozen"
    config = RegressionTrainConfig(output_dir=str(out), head_epochs=5, progress=False)
    report = train_regression_meter(meter, windows, examples, config)
    assert all(torch.equal(a, b) for a, b in zip(before, meter.backbone.parameters()))
    assert report["losses"][-1] < report["losses"][0]
    assert (out / "features.pt").exists() and (out / "head.pt").exists()


RESUME_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_meter_regression import resume_run
resume_run({out!r})
"""


def resume_run(out: str):
    """Train a tiny meter end to end (4 epochs of 3 steps, a checkpoint every 3 steps) into ``out``."""
    meter = tiny_meter(seed=5)
    windows, examples = [], []
    for messages, tokens in synthetic_set(12, seed=4):
        w, e = trajectory_examples(meter, messages, True, tokens, len(windows))
        windows += w
        examples += e
    config = RegressionTrainConfig(output_dir=out, freeze_backbone=False, epochs=4, batch_size=4, lr_backbone=1e-3,
                                   lr_head=1e-3, save_every=3, progress=False)
    train_regression_meter(meter, windows, examples, config)
    return meter


def test_end_to_end_training_resumes_exactly_after_a_kill(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    straight = resume_run(str(tmp_path / "straight"))
    out = tmp_path / "killed"
    script = RESUME_SCRIPT.format(tests=str(Path(__file__).parent), out=str(out))
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "checkpoint-3").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert (out / "checkpoint-3").is_dir() and not (out / "head.pt").exists()  # killed before the end
    resumed = resume_run(str(out))  # picks up checkpoint-3 and finishes the same schedule
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)


def test_turns_left_mark_every_state_and_one_pass_stays_exact():
    rng = random.Random(1)
    messages = episode(3, 4, rng)
    blocks = decision_blocks(messages, 2000, turn_limit=6)
    assert [b.rsplit("### next action", 1)[1] for b in blocks] == [f" (turns left: {6 - t})" for t in range(5)]
    assert all("turns left" not in b for b in decision_blocks(messages, 2000))  # no limit: the old text exactly
    meter = tiny_meter()
    meter.config = RegressionConfig(**{**meter.config.__dict__, "turn_limit": 6})
    one_pass = meter.score_trajectories([messages])[0]
    assert [r.logit for r in one_pass] == pytest.approx([r.logit for r in meter.score(prefixes(messages))], abs=1e-4)
    assert meter.turn_limit == 6


def test_readings_carry_the_calibrated_probability():
    import math

    meter = tiny_meter()
    messages = episode(2, 2, random.Random(2))
    plain = meter.score_trajectories([messages])[0]
    assert all(r.probability == pytest.approx(1 / (1 + math.exp(-r.logit))) for r in plain)
    meter.set_temperature(4.0)
    scaled = meter.score_trajectories([messages])[0]
    assert all(r.probability == pytest.approx(1 / (1 + math.exp(-r.logit / 4.0))) for r in scaled)
    assert [r.can_complete for r in scaled] == [r.logit > 0 for r in scaled]  # a temperature never moves b̂
    with pytest.raises(ValueError, match="temperature"):
        meter.set_temperature(0.0)


def test_a_nan_from_the_head_is_an_invalid_reading_and_extremes_are_clamped():
    """A NaN head output is an invalid reading (None, as an unparseable generative answer is), never a ValueError;
    saturated outputs are clamped to what a record may hold (|logit| ≤ 1e9, v̂ ≤ 1e12): a reading always writes."""
    import math

    from deltattg.data.trajectory import MeterOutput
    from deltattg.meter.regression import readings_from_head

    meter = tiny_meter()
    with torch.no_grad():
        meter.head.net[-1].bias[1] = float("nan")  # the value output of every state
    messages = episode(3, 2, random.Random(0))
    assert meter.score_trajectories([messages]) == [[None, None, None]] and meter.score([messages]) == [None]
    nan, inf = float("nan"), float("inf")
    assert readings_from_head(torch.tensor([[0.5, nan], [nan, 1.0]])) == [None, None]
    assert readings_from_head(torch.tensor([[nan, 0.5]]), "score") == [None]
    big, small = readings_from_head(torch.tensor([[1e12, 100.0], [-inf, -inf]]))
    assert big == MeterOutput(can_complete=True, tokens_to_go=1e12, logit=1e9, probability=1.0)
    assert small == MeterOutput(can_complete=False, tokens_to_go=0.0, logit=-1e9, probability=0.0)
    assert readings_from_head(torch.tensor([[inf, -1e30]]), "score") == [MeterOutput(logit=1e9, score=-1e9)]
    assert all(math.isfinite(v) for r in (big, small) for v in r.to_json().values() if not isinstance(v, bool))


def test_step_pairs_join_consecutive_states_of_one_window_only():
    from deltattg.meter.regression import Window
    from deltattg.meter.train_regression import step_pairs

    windows = [Window([1] * 9, [2, 5, 8], [0, 1, 2], [0, 3, 6]), Window([1] * 6, [2, 5], [3, 4], [0, 3]),
               Window([1] * 3, [2], [0], [0])]  # a long trajectory's two windows, then a one-state one
    first, second = step_pairs(windows)
    assert list(zip(first.tolist(), second.tolist())) == [(0, 1), (1, 2), (3, 4)]


def test_the_step_change_loss_reads_the_change_in_tokens_and_vanishes_where_it_is_exact():
    from deltattg.meter.train_regression import step_change_loss

    tokens = torch.tensor([30.0, 25.0, 25.0, 12.0])
    known = torch.tensor([True, True, True, False])
    first, second = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])
    exact = torch.log1p(tokens).requires_grad_()
    assert step_change_loss(exact, tokens, known, first, second).item() == pytest.approx(0.0, abs=1e-9)
    # the same absolute error on every state leaves log1p readings' changes almost right; one state off is not
    shifted = (torch.log1p(tokens) + torch.tensor([0.0, 0.2, 0.0, 0.0])).requires_grad_()
    loss = step_change_loss(shifted, tokens, known, first, second)
    loss.backward()
    assert loss.item() > 0.01 and shifted.grad[1] > 0 and shifted.grad[3] == 0  # pushes state 1 down; 3 is unknown
    assert step_change_loss(exact, tokens, torch.zeros(4, dtype=torch.bool), first, second).item() == 0.0


def test_the_step_change_loss_needs_the_backbone_trained(tmp_path):
    meter = tiny_meter()
    config = RegressionTrainConfig(output_dir=str(tmp_path / "m"), freeze_backbone=True, delta_weight=1.0,
                                   progress=False)
    with pytest.raises(ValueError, match="freeze_backbone off"):
        train_regression_meter(meter, [], [], config)


def test_training_with_the_step_change_loss_fits_the_changes(tmp_path):
    """End to end with the Δ term: the meter's change from state to state follows the labels' on held-out episodes
    better than a constant reading's would (no change at all)."""
    meter = tiny_meter()
    windows, examples = synthetic_examples(meter)
    config = RegressionTrainConfig(output_dir=str(tmp_path / "meter"), freeze_backbone=False, epochs=25, batch_size=8,
                                   lr_backbone=2e-3, lr_head=2e-3, save_every=10_000, progress=False, delta_weight=1.0)
    train_regression_meter(meter, windows, examples, config)
    test = synthetic_set(20, seed=1)
    errors, constant = [], []
    for (messages, tokens), readings in zip(test, meter.score_trajectories([m for m, _ in test])):
        truth = remaining_sums(tokens)
        read = [r.tokens_to_go for r in readings]
        errors += [abs((read[t] - read[t + 1]) - (truth[t] - truth[t + 1])) for t in range(len(truth) - 1)]
        constant += [abs(truth[t] - truth[t + 1]) for t in range(len(truth) - 1)]
    assert sum(errors) < 0.5 * sum(constant), (sum(errors), sum(constant))


def test_consecutive_pairs_name_by_example_the_pairs_step_pairs_name_by_read():

    meter = tiny_meter()
    windows, examples = synthetic_examples(meter)
    first, second = consecutive_pairs(windows, examples)
    rows = _row_of(windows, examples)
    by_read = set(zip(*(t.tolist() for t in step_pairs(windows))))
    assert len(first) == len(by_read) > 0
    assert {(rows[a], rows[b]) for a, b in zip(first.tolist(), second.tolist())} == by_read


def test_a_head_refresh_with_the_step_change_loss_learns_the_changes():
    """``train_head_on_features`` with consecutive ``pairs`` and ``delta_weight`` (the on-policy refresh's step-change
    loss, ``meter.refresh_delta_weight``): with no level loss on v (``regression_weight`` 0) only the Δ term trains
    v̂, and its changes from state to state follow the labels' far better than after the same training without it."""
    def change_error(with_pairs: bool) -> float:
        meter = tiny_meter()
        windows, examples = synthetic_examples(meter)
        with torch.no_grad():
            features = meter.boundary_features(windows)
        config = RegressionTrainConfig(output_dir="", head_epochs=15, batch_size=8, lr_head_frozen=1e-2, seed=0,
                                       progress=False, delta_weight=1.0, regression_weight=0.0)  # fmt: skip
        pairs = consecutive_pairs(windows, examples) if with_pairs else None
        train_head_on_features(meter, features, examples, _row_of(windows, examples), config, pairs=pairs)
        train = synthetic_set(40, seed=0)
        errors = []
        for (messages, tokens), readings in zip(train, meter.eval().score_trajectories([m for m, _ in train])):
            truth, read = remaining_sums(tokens), [r.tokens_to_go for r in readings]
            errors += [abs((read[t] - read[t + 1]) - (truth[t] - truth[t + 1])) for t in range(len(truth) - 1)]
        return sum(errors) / len(errors)

    without, with_steps = change_error(False), change_error(True)
    assert with_steps < 0.5 * without, (with_steps, without)
    score = tiny_meter()
    score.config = replace(score.config, target="score")
    with pytest.raises(ValueError, match="trains Token-to-Go"):
        OnPolicyRefresh(score, delta_weight=1.0)
