"""Training the generative progress meter: SFT (§3.1 Eq. 3, D.2) then GRPO refinement (D.2, Eq. 13), with TRL.

Data: one example per decision prefix — ``prompt`` = the meter's chat messages for the prefix (fitted to the meter's
prompt budget), ``completion`` = the answer ``format_answer(b, v)`` as one assistant message, plus the labels
``can_complete`` (b, Eq. 2) and ``tokens_to_go`` (v = TTG, Eq. 1; ``None`` when b = 0) that the GRPO reward reads.
It is a conversational prompt–completion dataset, so TRL renders it with the same chat template
:class:`~deltattg.meter.generative.GenerativeMeter` reads with.

* :func:`train_sft` — TRL ``SFTTrainer`` with completion-only loss: the answer-token cross-entropy of Eq. 3, prompt
  tokens masked (D.2). Defaults (D.2 / Table 4): lr 1e-5, one epoch.
* :func:`train_grpo` — TRL ``GRPOTrainer``: group of 8 sampled answers per prefix, lr 3e-6, reward
  :func:`progress_reward` (OUR reconstruction of the lost Eq. 4–5, see its doc) or any TRL reward functions you pass.
  Group advantages, Eq. 13: A_j = (r_j − mean) / (s + ε) with the SAMPLE std s of the group. TRL's
  ``scale_rewards="group"`` computes exactly that (Bessel-corrected ``nanstd`` over the group) but with a hard-coded
  ε = 1e-4 instead of the paper's 1e-6. The two agree (zero advantages) when a group's rewards are all equal, and
  differ by under 1 % whenever s ≥ 0.01; only groups whose rewards differ by less than ~1e-2 are scaled differently.

Both return the trained :class:`GenerativeMeter`, saved to ``output_dir`` in HF format (a LoRA adapter is merged into
the weights first); Trainer checkpoints (``output_dir/checkpoint-N``) make a run resumable with
``resume_from_checkpoint=True`` (latest) or a checkpoint path. Training updates ``meter.model`` in place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from deltattg.data.labels import prefix_labels
from deltattg.data.tokens import resolve_step_tokens
from deltattg.data.trajectory import Trajectory
from deltattg.meter.answer import format_answer, parse_answer
from deltattg.meter.generative import GenerativeMeter
from deltattg.meter.prompt import meter_messages

RewardFunc = Callable[..., list[float | None]]

SFT_DEFAULTS: dict[str, Any] = {"learning_rate": 1e-5, "num_train_epochs": 1}  # D.2, Table 4
GRPO_DEFAULTS: dict[str, Any] = {"learning_rate": 3e-6, "num_generations": 8, "scale_rewards": "group"}  # D.2, Eq. 13


# ---- data -----------------------------------------------------------------------------------------------------------


def trajectory_records(
    trajectories: Iterable[Trajectory], tokenizer: Any = None, *, terminal: bool = False
) -> Iterator[dict[str, Any]]:
    """Token-to-Go label records (Eq. 1–2) of every decision prefix; step token counts are taken from the trajectory
    or counted with ``tokenizer`` (see :func:`~deltattg.data.tokens.resolve_step_tokens`)."""
    for traj in trajectories:
        yield from prefix_labels(traj, resolve_step_tokens(traj, tokenizer), target="ttg", terminal=terminal)


def meter_example(
    messages: list[dict], can_complete: bool, tokens_to_go: int | None, tokenizer: Any, max_prompt_tokens: int,
    turn_limit: int | None = None,
) -> dict[str, Any]:
    """One training example: the prefix's meter prompt (with the turns left under ``turn_limit``), its target answer
    y (Eq. 3) and its labels (Eq. 2)."""
    return {
        "prompt": meter_messages(messages, tokenizer, max_prompt_tokens, turn_limit),
        "completion": [{"role": "assistant", "content": format_answer(can_complete, tokens_to_go)}],
        "can_complete": can_complete,
        "tokens_to_go": tokens_to_go,
    }


def meter_dataset(records: Iterable[dict], tokenizer: Any, max_prompt_tokens: int, turn_limit: int | None = None) -> Any:
    """A ``datasets.Dataset`` of :func:`meter_example` rows from label records (``messages``, ``can_complete``,
    ``tokens_to_go``), e.g. from :func:`trajectory_records` or a ``deltattg labels`` file."""
    from datasets import Dataset

    rows = [
        meter_example(r["messages"], r["can_complete"], r["tokens_to_go"], tokenizer, max_prompt_tokens, turn_limit)
        for r in records
    ]
    return Dataset.from_list(rows)


# ---- GRPO reward: OUR reconstruction of the lost Eq. 4-5 -------------------------------------------------------------


def token_score(predicted: int, target: int) -> float:
    """Scale-free token-accuracy score s = min(v̂+1, v+1) / max(v̂+1, v+1) ∈ (0, 1] (our stand-in for Eq. 5)."""
    low, high = sorted((predicted + 1, target + 1))
    return low / high


def progress_reward(completion_text: str, can_complete: bool, tokens_to_go: int | None) -> float:
    """The meter's GRPO reward for one sampled answer against its labels (b, v) of Eq. 2.

    OUR RECONSTRUCTION, REPLACEABLE: the paper's Eq. 4–5 ("reward and token-accuracy score") are lost in our copy
    (docs/concepts/meter.md says so). We use: 0 if the answer does not parse; for an unsuccessful target (b = 0), 1 if b̂ = 0 else 0;
    for a successful target (b = 1), 0 if b̂ = 0 else 0.5 + 0.5·s with s = :func:`token_score` (v̂, v).
    """
    if can_complete and tokens_to_go is None:
        raise ValueError("a successful target needs its tokens_to_go")
    reading = parse_answer(completion_text)
    if reading is None:
        return 0.0
    if not can_complete:
        return 0.0 if reading.can_complete else 1.0
    if not reading.can_complete:
        return 0.0
    return 0.5 + 0.5 * token_score(int(reading.tokens_to_go), int(tokens_to_go))


def completion_text(completion: str | list[dict]) -> str:
    """The text of a TRL completion: a string, or (conversational datasets) a list holding one assistant message."""
    return completion if isinstance(completion, str) else "".join(str(m.get("content") or "") for m in completion)


def progress_rewards(
    completions: Sequence[str | list[dict]],
    can_complete: Sequence[bool],
    tokens_to_go: Sequence[int | None],
    **_: Any,
) -> list[float]:
    """:func:`progress_reward` as a TRL reward function (dataset columns arrive as keyword arguments)."""
    labels = zip(completions, can_complete, tokens_to_go, strict=True)
    return [progress_reward(completion_text(c), b, v) for c, b, v in labels]


# ---- trainers --------------------------------------------------------------------------------------------------------


def _precision() -> dict[str, bool]:
    """bf16 mixed precision where the GPU supports it; fp32 elsewhere (TRL's default, bf16, would also apply on CPU)."""
    return {"bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()}


def sft_config(output_dir: str | os.PathLike, **overrides: Any) -> Any:
    """``SFTConfig`` for the meter: D.2 defaults, completion-only loss (Eq. 3), no truncation (prompts are already
    fitted to the meter's budget, and TRL would cut the answer off the end), no experiment trackers."""
    from trl import SFTConfig

    settings = {
        **SFT_DEFAULTS,
        **_precision(),
        "completion_only_loss": True,
        "max_length": None,
        "report_to": "none",
        **overrides,
    }
    return SFTConfig(output_dir=str(output_dir), **settings)


def grpo_config(output_dir: str | os.PathLike, *, max_completion_length: int, **overrides: Any) -> Any:
    """``GRPOConfig`` for the meter: D.2 defaults (group 8, lr 3e-6), Eq. 13 group scaling, answers of at most
    ``max_completion_length`` tokens (the meter's ``max_new_tokens``), no experiment trackers."""
    from trl import GRPOConfig

    settings = {
        **GRPO_DEFAULTS,
        **_precision(),
        "max_completion_length": max_completion_length,
        "report_to": "none",
        **overrides,
    }
    return GRPOConfig(output_dir=str(output_dir), **settings)


def sft_trainer(meter: GenerativeMeter, dataset: Any, args: Any, *, peft_config: Any = None) -> Any:
    """TRL's ``SFTTrainer`` on ``meter``'s model over :func:`meter_dataset` rows; its completion mask keeps only the
    answer tokens (and the end of turn) in the loss of Eq. 3."""
    from trl import SFTTrainer

    return SFTTrainer(
        model=meter.model,
        args=args,
        train_dataset=dataset.select_columns(["prompt", "completion"]),
        processing_class=meter.tokenizer,
        peft_config=peft_config,
    )


def grpo_trainer(
    meter: GenerativeMeter,
    dataset: Any,
    args: Any,
    *,
    reward_funcs: RewardFunc | list[RewardFunc] = progress_rewards,
    peft_config: Any = None,
) -> Any:
    """TRL's ``GRPOTrainer`` on ``meter``'s model over :func:`meter_dataset` rows, rewarded by ``reward_funcs``."""
    from trl import GRPOTrainer

    return GRPOTrainer(
        model=meter.model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,  # TRL passes every column but prompt/completion to the reward functions
        processing_class=meter.tokenizer,
        peft_config=peft_config,
    )


def train_sft(
    meter: GenerativeMeter,
    dataset: Any,
    output_dir: str | os.PathLike,
    *,
    args: Any = None,
    peft_config: Any = None,
    resume_from_checkpoint: bool | str | None = None,
) -> GenerativeMeter:
    """Fine-tune ``meter`` on :func:`meter_dataset` rows with the answer-token loss of Eq. 3 (D.2)."""
    trainer = sft_trainer(meter, dataset, args if args is not None else sft_config(output_dir), peft_config=peft_config)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return _save_trained(trainer, meter, output_dir)


def train_grpo(
    meter: GenerativeMeter,
    dataset: Any,
    output_dir: str | os.PathLike,
    *,
    reward_funcs: RewardFunc | list[RewardFunc] = progress_rewards,
    args: Any = None,
    peft_config: Any = None,
    resume_from_checkpoint: bool | str | None = None,
) -> GenerativeMeter:
    """Refine ``meter`` with GRPO (D.2): sample a group of answers per prefix, reward them with ``reward_funcs``
    (default: our reconstructed :func:`progress_reward`), normalise within the group (Eq. 13, see module doc)."""
    if args is None:
        args = grpo_config(output_dir, max_completion_length=meter.max_new_tokens)
    trainer = grpo_trainer(meter, dataset, args, reward_funcs=reward_funcs, peft_config=peft_config)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return _save_trained(trainer, meter, output_dir)


def _save_trained(trainer: Any, meter: GenerativeMeter, output_dir: str | os.PathLike) -> GenerativeMeter:
    """The trained model (LoRA merged in) as a meter with ``meter``'s settings, saved to ``output_dir``."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = model.merge_and_unload()
    trained = GenerativeMeter(model, meter.tokenizer, **{**meter.settings(),
                                                        "name": os.path.basename(os.path.normpath(output_dir))})
    trained.save_pretrained(output_dir)
    return trained
