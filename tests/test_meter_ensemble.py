"""Regression meter options: a seed ensemble of heads (``--ensemble N``) and the hidden layer read (``--layer``)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from deltattg.cli import main
from deltattg.meter.regression import HeadEnsemble, RegressionMeter, average_readings, head_members
from deltattg.meter.features import cached_features, feature_settings, window_key
from deltattg.meter.train_regression import RegressionTrainConfig, train_regression_meter, trajectory_examples
from test_meter_cli import apb_record
from test_meter_regression import episode, synthetic_set, tiny_meter

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def training_set(meter: RegressionMeter, n: int = 12, seed: int = 2):
    windows, examples = [], []
    for k, (messages, tokens) in enumerate(synthetic_set(n, seed=seed)):
        w, e = trajectory_examples(meter, messages, k % 3 != 0, tokens, len(windows))
        windows += w
        examples += e
    return windows, examples


def test_average_readings_by_hand():
    # two heads: p = σ(0) = 0.5 and σ(ln 3) = 0.75 -> mean 0.625 -> logit ln(0.625 / 0.375) = ln(5/3);
    # TTG expm1(ln 11) = 10 and expm1(ln 31) = 30 -> mean 20 -> log1p(20); a negative prediction counts as 0 tokens.
    outputs = torch.tensor([[[0.0, math.log(11.0)], [0.0, -2.0]], [[math.log(3.0), math.log(31.0)], [0.0, math.log(5.0)]]])
    averaged = average_readings(outputs)
    assert averaged[0].tolist() == pytest.approx([math.log(5 / 3), math.log1p(20.0)], abs=1e-5)
    assert averaged[1].tolist() == pytest.approx([0.0, math.log1p(2.0)], abs=1e-5)
    assert average_readings(outputs, "score")[0, 1].item() == pytest.approx((math.log(11.0) + math.log(31.0)) / 2)
    saturated = average_readings(torch.tensor([[[80.0, 0.0]], [[90.0, 0.0]]]))  # no inf/nan for confident heads
    assert torch.isfinite(saturated).all() and saturated[0, 0] > 50


def test_an_ensemble_reading_averages_its_heads_readings():
    meter = tiny_meter(ensemble=3)
    assert isinstance(meter.head, HeadEnsemble) and len(head_members(meter.head)) == 3
    for k, head in enumerate(head_members(meter.head)):
        head.reset(10 + k)
    trajectories = [episode(3, 4, random.Random(0)), episode(2, 2, random.Random(1))]
    together = [r for rows in meter.score_trajectories(trajectories) for r in rows]
    alone = []
    for head in head_members(meter.head):
        single = RegressionMeter(meter.backbone, meter.tokenizer, meter.config, head=head).eval()
        alone.append([r for rows in single.score_trajectories(trajectories) for r in rows])
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for k, reading in enumerate(together):
        assert sigmoid(reading.logit) == pytest.approx(sum(sigmoid(a[k].logit) for a in alone) / 3, abs=1e-5)
        mean_ttg = sum(a[k].tokens_to_go for a in alone) / 3
        assert reading.tokens_to_go == pytest.approx(mean_ttg, abs=1.0)  # each reading is rounded to whole tokens
    assert len({round(a[0].logit, 6) for a in alone}) == 3  # the heads really differ


def test_ensemble_heads_are_the_single_heads_of_consecutive_seeds(tmp_path):
    ensemble = tiny_meter(ensemble=3)
    windows, examples = training_set(ensemble)
    report = train_regression_meter(ensemble, windows, examples, RegressionTrainConfig(
        output_dir=str(tmp_path / "ens"), head_epochs=3, seed=7, progress=False))
    assert len(report["head_losses"]) == 3 and report["losses"] == report["head_losses"][0]
    members = head_members(ensemble.head)
    for k in range(3):
        single = tiny_meter()
        train_regression_meter(single, windows, examples, RegressionTrainConfig(
            output_dir=str(tmp_path / f"single{k}"), head_epochs=3, seed=7 + k, progress=False))
        for a, b in zip(members[k].state_dict().values(), single.head.state_dict().values()):
            assert torch.allclose(a, b, atol=1e-6)
    first, second = (m.state_dict()["net.1.weight"] for m in members[:2])
    assert not torch.allclose(first, second)


def test_an_ensemble_round_trips_through_save_and_load(tmp_path):
    meter = tiny_meter(ensemble=2, layer=1)
    windows, examples = training_set(meter, n=6)
    train_regression_meter(meter, windows, examples, RegressionTrainConfig(
        output_dir=str(tmp_path / "m"), head_epochs=2, freeze_backbone=False, epochs=1, save_every=10_000,
        progress=False))
    loaded = RegressionMeter.from_pretrained(tmp_path / "m")
    assert (loaded.config.ensemble, loaded.config.layer) == (2, 1) and isinstance(loaded.head, HeadEnsemble)
    trajectories = [episode(3, 3, random.Random(4))]
    before = meter.eval().score_trajectories(trajectories)[0]
    after = loaded.score_trajectories(trajectories)[0]
    assert [r.logit for r in after] == pytest.approx([r.logit for r in before], abs=1e-5)
    assert [r.tokens_to_go for r in after] == [r.tokens_to_go for r in before]


def test_layer_reads_that_decoder_layer():
    messages = episode(2, 3, random.Random(3))
    features = {}
    for layer in (None, 1, 2):
        meter = tiny_meter(layer=layer)  # same seed: the same backbone
        features[layer] = meter.boundary_features(meter.windows(messages))
    assert torch.allclose(features[2], features[None], atol=1e-6)  # the last layer is the final (normalised) state
    assert not torch.allclose(features[1], features[None], atol=1e-3)
    meter = tiny_meter(layer=1)
    ids = torch.tensor([meter.windows(messages)[0].ids])
    states = meter.backbone(input_ids=ids, output_hidden_states=True).hidden_states[1][0]
    assert torch.allclose(features[1], states[meter.windows(messages)[0].positions], atol=1e-6)
    with pytest.raises(ValueError, match="layer must be in 1..2"):
        tiny_meter(layer=3)


def test_the_feature_cache_is_keyed_by_pooling_and_layer(tmp_path):
    out = str(tmp_path / "shared-folder")
    widths = []
    for pooling, layer in (("last", None), ("last+mean", None), ("last+mean", 1)):
        meter = tiny_meter(pooling=pooling, layer=layer)
        windows, examples = training_set(meter, n=4)
        train_regression_meter(meter, windows, examples, RegressionTrainConfig(output_dir=out, head_epochs=1,
                                                                               progress=False))
        saved = torch.load(tmp_path / "shared-folder" / "features.pt")
        assert saved["settings"] == feature_settings(meter)  # the other settings' features were not reused
        cached = torch.cat([saved["windows"][window_key(w)] for w in windows])
        widths.append(cached.shape[1])
        assert torch.allclose(cached, meter.boundary_features(windows), atol=1e-5)
    assert widths == [48, 96, 96]


def test_a_grown_pool_computes_only_its_new_windows(tmp_path, monkeypatch):
    meter = tiny_meter(pooling="last+mean")
    windows, _ = training_set(meter, n=6)
    path = tmp_path / "features.pt"
    first = cached_features(meter, windows[:4], path, progress=False)
    read = []
    original = RegressionMeter.boundary_features
    monkeypatch.setattr(RegressionMeter, "boundary_features", lambda self, ws: read.extend(ws) or original(self, ws))
    grown = cached_features(meter, windows, path, progress=False)
    assert read == list(windows[4:])  # only the new windows went through the backbone
    assert torch.equal(grown[: len(first)], first)
    assert torch.allclose(grown, original(meter, windows), atol=1e-5)
    read.clear()
    assert torch.equal(cached_features(meter, windows, path, progress=False), grown) and read == []
    assert [f.name for f in tmp_path.iterdir()] == ["features.pt"]  # no partial file left behind


def test_train_meter_ensemble_and_layer_options(tmp_path, capsys):
    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(6)))
    backbone = tmp_path / "tiny"
    tiny_meter().save_pretrained(backbone)
    folder = tmp_path / "ens-meter"
    common = ["--model", str(backbone / "backbone"), "--head-epochs", "2", "--tokenizer", str(backbone / "backbone")]
    assert main(["train-meter", str(src), "--out", str(folder), "--ensemble", "3", "--layer", "1", *common]) == 0
    config = json.loads((folder / "meter_config.json").read_text())
    assert (config["ensemble"], config["layer"]) == (3, 1)
    assert len(json.loads((folder / "train_report.json").read_text())["head_losses"]) == 3
    result = tmp_path / "eval.json"
    assert main(["eval-steps", "--meter", str(folder), "--data", str(src), "--json", str(result), "--no-progress",
                 "--readout", "expected"]) == 0
    assert json.loads(result.read_text())["pooled"]["meter (expected)"]["invalid"] == 0
    capsys.readouterr()
    assert main(["train-meter", str(src), "--out", str(tmp_path / "deep"), "--layer", "5", *common]) == 2
    assert "layer must be in 1..2" in capsys.readouterr().err
    config["layer"] = 0
    (folder / "meter_config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exited:  # a bad saved config is refused, naming the file and the field
        main(["eval-steps", "--meter", str(folder), "--data", str(src), "--no-progress"])
    assert exited.value.code == 2
    assert "meter_config.json: layer: must be null or a decoder layer" in capsys.readouterr().err


def test_a_pessimistic_ensemble_of_meters_by_hand(tmp_path):
    from deltattg.data.trajectory import MeterOutput
    from deltattg.meter.ensemble import MeterEnsemble, pessimistic_reading
    from deltattg.meter.loading import load_meter, read_states

    # p̃ 0.9, 0.5 and b̂ = 1 (no probability: 1.0): mean 0.8, population std sqrt((0.01 + 0.09 + 0.04) / 3) = 0.2160
    # -> p̃ = 0.5840, b̂ = 1; v̂ = the mean of 10, 20 (the third gives none).
    combined = pessimistic_reading([MeterOutput(True, 10.0, probability=0.9), MeterOutput(False, 20.0, probability=0.5),
                                    MeterOutput(True, None)])  # fmt: skip
    assert combined.probability == pytest.approx(0.8 - (0.14 / 3) ** 0.5) and combined.can_complete
    assert combined.tokens_to_go == pytest.approx(15.0)
    assert pessimistic_reading([MeterOutput(True, 10.0, probability=0.9), None]) is None  # no guessing for a member
    assert pessimistic_reading([MeterOutput(True, 1.0, probability=0.9)] * 2).probability == pytest.approx(0.9)
    # Two tiny regression meters of different seeds, loaded as "a,b": every state is their pessimistic combination.
    for seed in (0, 1):
        tiny_meter(seed=seed).save_pretrained(tmp_path / f"m{seed}")
    ensemble = load_meter(f"{tmp_path / 'm0'},{tmp_path / 'm1'}")
    assert isinstance(ensemble, MeterEnsemble) and "ensemble(" in ensemble.meter_id
    from deltattg.data.trajectory import Trajectory

    trajectory = Trajectory("t", "g", 1.0, True, messages=episode(2, 3, random.Random(0)), step_tokens=[1, 1, 1])
    together, _ = read_states(ensemble, [trajectory])
    alone = [read_states(load_meter(tmp_path / f"m{seed}"), [trajectory])[0][0] for seed in (0, 1)]
    assert together[0] == [pessimistic_reading(list(pair)) for pair in zip(*alone)]
    first_state = trajectory.messages[:2]  # h_0: prefix by prefix, the same reading as in one pass
    assert ensemble.score([first_state])[0].probability == pytest.approx(together[0][0].probability, abs=1e-5)
    with pytest.raises(ValueError, match="at least two"):
        MeterEnsemble([load_meter(tmp_path / "m0")])
