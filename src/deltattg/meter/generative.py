"""The paper's generative progress meter, in process: an HF causal LM reads a decision prefix and writes its answer.

f_φ(h) = (b̂, v̂) (§3.1): the prompt is :func:`~deltattg.meter.prompt.meter_messages` rendered by the model's chat
template; the answer is decoded greedily (left-padded batches, at most ``max_new_tokens``, stopping at the end of the
turn) and read by the strict :func:`~deltattg.meter.answer.parse_answer` — anything else is ``None``, never a guess.

The E.4 (+logit) readout (Eq. 19) is z = log p(true) − log p(false) read right after the fixed answer prefix
``{"can_complete":`` (:data:`~deltattg.meter.answer.LOGIT_PREFIX`) appended to the generation prompt. How ``true`` and
``false`` become tokens depends on the tokenizer: byte-level BPEs (SmolLM2, Qwen, Llama 3) write the space into the
word (``Ġtrue`` / ``Ġfalse``), others emit the space on its own or drop it. :func:`logit_readout_ids` handles all of
them the same way: it tokenizes the prompt followed by each full answer (exactly the text the meter was trained to
write, :func:`~deltattg.meter.answer.format_answer`) and compares the FIRST TOKEN AT WHICH THE TWO DIFFER, read after
their shared tokens. For the BPEs above that is the token right after the prefix; where a lone space token comes first,
it is shared by both answers, so conditioning on it leaves z the log-ratio of the two answers' first distinct tokens
(log p(" true") − log p(" false") = log p(true | " ") − log p(false | " ")).

:meth:`GenerativeMeter.score_trajectories` reads every state of a trajectory on one shared key/value cache
(:mod:`~deltattg.meter.shared_prefix`: the longest prompt prefilled once, each state's closing and answer on its cache,
the E.4 logit read in the same pass); :meth:`~GenerativeMeter.score` reads each prefix as its own prompt (guidance's
candidates, ``score --per-prefix``). Both give the same greedy answers up to float rounding.

A checkpoint is an HF folder (``save_pretrained`` of model and tokenizer) plus ``meter_config.json``
(``kind = "generative"``, the prompt version it was trained on, its prompt and answer budgets).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, get_args

import torch

from deltattg.data.trajectory import MeterOutput, calibrated_probability, state_prefixes
from deltattg.hf import common_prefix_length
from deltattg.meter.answer import format_answer, parse_answer
from deltattg.meter.prompt import HISTORY_END, PROMPT_VERSION, meter_messages, render_prompt

CONFIG_NAME = "meter_config.json"
KIND = "generative"
DEFAULT_MAX_NEW_TOKENS = 32  # the longest answer (16 digits) is 32 tokens where each digit is one (SmolLM2, Qwen)

Readout = Literal["answer", "logit", "both"]
READOUTS: tuple[str, ...] = get_args(Readout)


def logit_readout_ids(tokenizer: Any, prompt: str) -> tuple[list[int], int, int]:
    """``(context, true_id, false_id)`` for the E.4 readout (Eq. 19) after the rendered ``prompt``.

    Both answers are tokenized in full after ``prompt``; ``context`` is their shared leading ids (the prompt, the
    prefix ``{"can_complete":`` and any shared space token) and ``true_id`` / ``false_id`` their first differing ids.
    """
    yes, no = (
        tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
        for answer in (format_answer(True, 0), format_answer(False, None))
    )
    shared = common_prefix_length(yes, no)
    return list(yes[:shared]), yes[shared], no[shared]


def history_tokens(tokenizer: Any, prompt: str, slack: int = 4) -> int:
    """How many leading tokens of ``prompt`` hold the instruction and the history (all but its closing: the
    end-of-history delimiter and the template's end of turn), less ``slack`` tokens that may merge differently across
    the boundary."""
    history = prompt[: prompt.rindex(HISTORY_END)] if HISTORY_END in prompt else prompt
    return max(len(tokenizer(history, add_special_tokens=False)["input_ids"]) - slack, 0)


def draft_of(prompt_ids: Sequence[int], context: Sequence[int]) -> list[int]:
    """The tokens the E.4 readout's context adds after the prompt's own ids (``[]`` where tokenizing the two texts
    together changed the prompt's last ids: that readout then needs its own pass)."""
    return list(context[len(prompt_ids) :]) if list(context[: len(prompt_ids)]) == list(prompt_ids) else []


def answer_text(ids: Sequence[int], stop_ids: Sequence[int], tokenizer: Any) -> str:
    """The generated answer: ``ids`` up to the first stop token, decoded WITHOUT skipping special tokens, so that a
    stray special token inside an answer makes it invalid instead of disappearing."""
    end = next((i for i, token in enumerate(ids) if token in stop_ids), len(ids))
    return tokenizer.decode(list(ids[:end]), skip_special_tokens=False)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the model's generation-config EOS (one id or a list) and the tokenizer's EOS."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    return sorted({i for i in [*ids, tokenizer.eos_token_id] if i is not None})


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first), so that padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def weights_key(model: Any) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter is replaced or updated in place (storage address and autograd version counter):
    tells a cached :func:`meter_digest` that it went stale, without re-hashing the weights."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def meter_digest(model: Any, tokenizer: Any, settings: dict[str, Any]) -> str:
    """SHA-256 of everything that determines a reading: the weights (bytes), the model config, the tokenizer's
    vocabulary and chat template, and ``settings`` (prompt version, budgets, readout)."""
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    digest = hashlib.sha256()
    for part in (config, tokenizer.get_vocab(), tokenizer.chat_template, settings):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    for name, param in model.named_parameters():
        digest.update(f"{name}:{param.dtype}:{tuple(param.shape)}".encode())
        digest.update(memoryview(param.detach().cpu().contiguous().view(torch.uint8).numpy()))
    return digest.hexdigest()


def default_prompt_budget(model: Any, max_new_tokens: int) -> int:
    """The longest prompt that leaves room for the answer in the model's context window."""
    context = getattr(model.config, "max_position_embeddings", None)
    if context is None:
        raise ValueError("the model config has no max_position_embeddings: pass max_prompt_tokens")
    return context - max_new_tokens


def read_meter_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The settings in ``directory/meter_config.json`` ({} when absent); refuses other meter kinds and other prompt
    versions."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if config.get("kind") != KIND:
        raise ValueError(f"{path} describes a {config.get('kind')!r} meter, not a {KIND!r} one")
    if config.get("prompt_version") != PROMPT_VERSION:
        raise ValueError(
            f"{path}: the meter was trained on prompt version {config.get('prompt_version')}, "
            f"this library writes version {PROMPT_VERSION}; retrain it"
        )
    return {k: config[k] for k in ("max_prompt_tokens", "max_new_tokens", "turn_limit", "temperature", "readout",
                                    "labels") if k in config}  # fmt: skip


class GenerativeMeter:
    """A :class:`~deltattg.meter.base.Meter` over an in-process HF causal LM (CPU or GPU), §3.1.

    ``readout`` chooses what :meth:`score` returns: ``"answer"`` — the parsed greedy answer (b̂, v̂) or ``None``;
    ``"logit"`` — only the E.4 logit z (Eq. 19), one forward pass and no decoding, every reading valid;
    ``"both"`` — the parsed answer with z attached (``None`` when the answer is invalid).

    ``max_prompt_tokens`` defaults to the context window less ``max_new_tokens``. ``meter_id`` hashes the weights,
    config, tokenizer, :data:`~deltattg.meter.prompt.PROMPT_VERSION`, both budgets and the readout; it is computed on
    first use (≈1 s for 135 M fp32 parameters on CPU) and again only after the weights change.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_prompt_tokens: int | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        batch_size: int = 8,
        readout: Readout = "answer",
        name: str = "model",
        turn_limit: int | None = None,
        temperature: float = 1.0,
        labels: dict[str, Any] | None = None,
    ):
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
        if not 0 < temperature < math.inf:
            raise ValueError(f"the temperature must be a positive number, got {temperature!r}")
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be at least 1")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = (
            default_prompt_budget(model, max_new_tokens) if max_prompt_tokens is None else max_prompt_tokens
        )
        meter_messages([], tokenizer, self.max_prompt_tokens)  # a budget below the bare instruction fails here
        self.batch_size = batch_size
        self.readout = readout
        self.name = name
        self.turn_limit = turn_limit  # the episodes' turn limit: each prompt states the turns left
        self.temperature = float(temperature)  # p̃ = σ(z / temperature), fitted on held-out states
        self.labels = labels  # the label source it was trained on (``rollout.label_sources.LabelSettings``)
        self.stop_ids = stop_token_ids(model, tokenizer)
        self._digest: tuple[tuple, str] | None = None
        self.prefix_stats: Any = None  # tokens read by the latest score_trajectories (a PrefixStats)

    @classmethod
    def from_pretrained(
        cls, path_or_spec: str, *, device: str | torch.device | None = None, dtype: Any = None, **settings: Any
    ) -> GenerativeMeter:
        """A meter from a checkpoint folder, an HF id or a model spec of :mod:`deltattg.hf` (e.g. ``smollm2``).

        ``settings`` (the constructor's keywords) override those in ``meter_config.json``.
        """
        from deltattg.hf import load_causal_lm, load_tokenizer, resolve_pretrained

        folder, _ = resolve_pretrained(path_or_spec)
        settings = {**read_meter_config(folder), **settings}
        model = load_causal_lm(path_or_spec, **({"dtype": dtype} if dtype is not None else {}))
        if device is not None:
            model = model.to(device)
        name = os.path.basename(os.path.normpath(path_or_spec.partition("::")[0]))
        return cls(model, load_tokenizer(path_or_spec), name=settings.pop("name", name), **settings)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Model and tokenizer via ``save_pretrained``, plus ``meter_config.json``."""
        os.makedirs(directory, exist_ok=True)
        from deltattg.hf import save_model

        save_model(self.model, self.tokenizer, directory)
        self.save_config(directory)

    def save_config(self, directory: str | os.PathLike) -> None:
        """``meter_config.json``: the kind, prompt version and this meter's settings (a re-fitted temperature
        changes only this file)."""
        config = {
            "kind": KIND,
            "prompt_version": PROMPT_VERSION,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_new_tokens": self.max_new_tokens,
            "turn_limit": self.turn_limit,
            "temperature": self.temperature,
            "readout": self.readout,
            "labels": self.labels,
        }
        with open(os.path.join(directory, CONFIG_NAME), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
            handle.write("\n")

    @property
    def meter_id(self) -> str:
        key = weights_key(self.model)
        if self._digest is None or self._digest[0] != key:
            settings = {
                "prompt_version": PROMPT_VERSION,
                "max_prompt_tokens": self.max_prompt_tokens,
                "max_new_tokens": self.max_new_tokens,
                "readout": self.readout,
                "turn_limit": self.turn_limit,
                "temperature": self.temperature,
            }
            self._digest = (key, meter_digest(self.model, self.tokenizer, settings))
        return f"{KIND}:{self.name}:{self._digest[1][:16]}"

    def prompts(self, histories: Sequence[list[dict]]) -> list[str]:
        """The rendered prompt of each decision prefix (fitted to ``max_prompt_tokens``)."""
        tokenizer = self.tokenizer
        return [render_prompt(meter_messages(h, tokenizer, self.max_prompt_tokens, self.turn_limit), tokenizer)
                for h in histories]  # fmt: skip

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """One reading per history, in order (see the class doc for ``readout``)."""
        prompts = self.prompts(histories)
        answers = [None] * len(prompts) if self.readout == "logit" else self._generate(prompts)
        logits = [None] * len(prompts) if self.readout == "answer" else self._logits(prompts)
        return [self._reading(answer, z) for answer, z in zip(answers, logits)]

    def score_trajectories(self, trajectories: Sequence[list[dict]]) -> list[list[MeterOutput | None]]:
        """Readings of every decision state t = 0..T of each trajectory's messages (T + 1 each, h_T after the last
        action), all of a trajectory's prompts read on one shared key/value cache
        (:mod:`~deltattg.meter.shared_prefix`); equal to :meth:`score` of each prefix up to float rounding."""
        answers, logits = self._read_trajectories(trajectories, self.readout != "logit", self.readout != "answer")
        return [[self._reading(a, z) for a, z in zip(*row)] for row in zip(answers, logits)]

    def generate_trajectories(self, trajectories: Sequence[list[dict]]) -> list[list[str]]:
        """The raw greedy answer text for every decision state t = 0..T of each trajectory, read as
        :meth:`score_trajectories` reads them (:meth:`generate`'s texts, up to float rounding)."""
        return self._read_trajectories(trajectories, True, False)[0]

    @torch.inference_mode()
    def _read_trajectories(self, trajectories: Sequence[list[dict]], answers: bool,
                           logits: bool) -> tuple[list[list[str]], list[list[float | None]]]:  # fmt: skip
        """Greedy answers (``""`` where not asked) and E.4 logits (``None`` where not asked) of every state of each
        trajectory, the states of a trajectory on one shared key/value cache (:class:`SharedPrefixDecoder`); the
        cache carries over between trajectories, so the instruction, and a group's task, are read once."""
        from deltattg.meter.shared_prefix import SharedPrefixDecoder

        with SharedPrefixDecoder(self.model, max_new_tokens=self.max_new_tokens, stop_ids=self.stop_ids) as decoder:
            self.prefix_stats = decoder.stats  # tokens read by this call
            read = [self._read_trajectory(decoder, messages, answers, logits) for messages in trajectories]
        return [text for text, _ in read], [z for _, z in read]

    def _read_trajectory(self, decoder: Any, messages: list[dict], answers: bool,
                         logits: bool) -> tuple[list[str], list[float | None]]:  # fmt: skip
        """:meth:`_read_trajectories` of one trajectory on ``decoder`` (a ``SharedPrefixDecoder``)."""
        from deltattg.meter.shared_prefix import Row, plan_bases

        prompts = self.prompts(state_prefixes(messages, terminal=True))
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        text, z = [""] * len(ids), [None] * len(ids)
        for base, members in plan_bases(ids, [history_tokens(self.tokenizer, p) for p in prompts]):
            reads = [logit_readout_ids(self.tokenizer, prompts[k]) for k in members]
            rows = [Row(cached, ids[k][cached:], draft_of(ids[k], context))
                    for k, (context, _, _) in zip(members, reads)
                    for cached in [min(common_prefix_length(ids[k], ids[base]), len(ids[k]) - 1)]]  # fmt: skip
            decoder.prefill(ids[base][: max(row.cached for row in rows)])
            decoder.answer(rows, decode=answers)
            for k, row, (_, true_id, false_id) in zip(members, rows, reads):
                if answers:
                    text[k] = answer_text(row.answer, self.stop_ids, self.tokenizer)
                if logits:  # a prompt whose readout context re-tokenizes its end gets its own pass
                    z[k] = (float(row.draft_logprobs[true_id] - row.draft_logprobs[false_id]) if row.draft
                            else self._logits([prompts[k]])[0])  # fmt: skip
        return text, z

    def _reading(self, answer: str | None, z: float | None) -> MeterOutput | None:
        """One reading from a greedy answer and the E.4 logit, as ``readout`` asks; with the logit comes the
        calibrated completion probability p̃ = σ(z / temperature), i.e. p(true) / (p(true) + p(false)) at
        ``{"can_complete":`` sharpened or softened by the fitted temperature."""
        p = None if z is None else calibrated_probability(z, self.temperature)
        if self.readout == "logit":
            return MeterOutput(logit=z, probability=p)
        reading = parse_answer(answer)
        return reading if self.readout == "answer" or reading is None else replace(reading, logit=z, probability=p)

    def settings(self) -> dict[str, Any]:
        """The constructor's keyword settings of this meter."""
        return {"max_prompt_tokens": self.max_prompt_tokens, "max_new_tokens": self.max_new_tokens,
                "batch_size": self.batch_size, "readout": self.readout, "name": self.name,
                "turn_limit": self.turn_limit, "temperature": self.temperature, "labels": self.labels}  # fmt: skip

    def with_settings(self, **changes: Any) -> GenerativeMeter:
        """A meter on the same model and tokenizer with some settings changed (e.g. ``readout``)."""
        return GenerativeMeter(self.model, self.tokenizer, **{**self.settings(), **changes})

    def set_temperature(self, temperature: float) -> None:
        """Use p̃ = σ(z / temperature) from now on (saved with the meter; its id changes with it)."""
        if not 0 < temperature < math.inf:
            raise ValueError(f"the temperature must be a positive number, got {temperature!r}")
        self.temperature = float(temperature)
        self._digest = None

    def generate(self, histories: Sequence[list[dict]]) -> list[str]:
        """The raw greedy answer text for each history (end-of-turn token and padding removed)."""
        return self._generate(self.prompts(histories))

    def logits(self, histories: Sequence[list[dict]]) -> list[float]:
        """z = log p(true) − log p(false) after ``{"can_complete":`` for each history (E.4, Eq. 19)."""
        return self._logits(self.prompts(histories))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _left_padded(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer.pad({"input_ids": rows}, padding_side="left", return_tensors="pt")
        return {key: value.to(self.device) for key, value in batch.items()}

    @torch.inference_mode()
    def _generate(self, prompts: list[str]) -> list[str]:
        from transformers import GenerationConfig

        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        rows = self.tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
        texts = [""] * len(rows)
        for chunk in length_batches([len(r) for r in rows], self.batch_size):
            batch = self._left_padded([rows[i] for i in chunk])
            generated = self.model.generate(**batch, generation_config=config)
            for i, ids in zip(chunk, generated[:, batch["input_ids"].shape[1] :].tolist()):
                texts[i] = answer_text(ids, self.stop_ids, self.tokenizer)
        return texts

    @torch.inference_mode()
    def _logits(self, prompts: list[str]) -> list[float]:
        reads = [logit_readout_ids(self.tokenizer, p) for p in prompts]
        z = [0.0] * len(reads)
        for chunk in length_batches([len(r[0]) for r in reads], self.batch_size):
            batch = self._left_padded([reads[i][0] for i in chunk])
            positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # left padding: count real tokens only
            last = self.model(**batch, position_ids=positions, logits_to_keep=1).logits[:, -1].float()
            logp = torch.log_softmax(last, dim=-1)
            for row, i in enumerate(chunk):
                _, true_id, false_id = reads[i]
                z[i] = float(logp[row, true_id] - logp[row, false_id])
        return z
