"""The actor: building it (a tiny word-level Llama over the environment's vocabulary, or any HF model; LoRA via
peft), its frozen reference π_ref for the KL term, expert demonstrations in the actor's own prompt format, the check
that its tokenizer knows every prompt word, and behaviour cloning (the warm start before RL)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.envs.household.catalog import split_words
from deltattg.loss import token_mean
from deltattg.rollout.engine import Action, Episode, run_episodes
from deltattg.rollout.policies import LMPolicy, NoisyExpertPolicy
from deltattg.rollout.prompts import PromptConfig, chat_prompt, window_prompt
from deltattg.train.config import ActorConfig
from deltattg.train.rows import Row, chunks, collate, response_logprobs, rows_logprobs, step_rows

TINY = "tiny"


def torch_device(spec: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if spec == "auto" else spec)


def prompt_words(prompt: PromptConfig, max_turns: int) -> list[str]:
    """Every word the prompt layouts of :mod:`deltattg.rollout.prompts` add around the environment's text, for up to
    ``max_turns`` steps of history (the step counts are words too)."""
    texts = []
    for k in range(max_turns + 1):
        texts += [m["content"] for m in window_prompt("", "", [("", "")] * k, "", [""], prompt)]
    texts += [m["content"] for m in chat_prompt([{"role": "user", "content": ""}], [""], prompt)]
    return sorted({w for text in texts for w in split_words(text)})


def tiny_tokenizer(env: Environment, prompt: PromptConfig, max_turns: int) -> Any:
    """A word-level tokenizer over the environment's vocabulary and the prompt's words, or, for an environment that
    lists none (AWM, BFCL, τ²: JSON tool calls), a byte-level one."""
    from deltattg.tiny import byte_tokenizer, word_tokenizer

    if not hasattr(env, "vocabulary"):
        return byte_tokenizer()
    return word_tokenizer([*env.vocabulary(), *prompt_words(prompt, max_turns)])


def initial_actor(
    config: ActorConfig, env: Environment, prompt: PromptConfig, max_turns: int, seed: int
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` before any training (without LoRA adapters): the π_ref of the KL term."""
    if config.model == TINY:
        from deltattg.tiny import tiny_llama

        tokenizer = tiny_tokenizer(env, prompt, max_turns)
        model = tiny_llama(
            tokenizer, hidden=config.tiny_hidden, layers=config.tiny_layers, heads=config.tiny_heads, seed=seed
        )
        return model.to(getattr(torch, config.dtype)), tokenizer
    return pretrained(config.model, config.dtype)


def pretrained(spec: str, dtype: str) -> tuple[Any, Any]:
    """A causal LM and its tokenizer from an HF id, a folder or a model spec of :mod:`deltattg.hf`."""
    from deltattg.hf import load_causal_lm, load_tokenizer

    return load_causal_lm(spec, dtype=getattr(torch, dtype)), load_tokenizer(spec)


def with_lora(model: Any, config: ActorConfig, adapters: Path | None = None) -> Any:
    """The model with trainable LoRA adapters (peft): fresh ones, or those saved in folder ``adapters``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapters is not None:
        return PeftModel.from_pretrained(model, str(adapters), is_trainable=True)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=list(config.lora_targets),
                      lora_dropout=0.0, task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(model, lora)


def load_actor(
    config: ActorConfig,
    env: Environment,
    prompt: PromptConfig,
    max_turns: int,
    seed: int,
    checkpoint: Path | None = None,
) -> tuple[Any, Any]:
    """The trainable actor and its tokenizer: the initial one (plus fresh LoRA adapters), or the one saved in a
    checkpoint folder by ``save_pretrained`` (full weights, or LoRA adapters over the initial model)."""
    if checkpoint is not None and config.lora_rank == 0:
        model, tokenizer = pretrained(str(checkpoint), config.dtype)
    else:
        model, tokenizer = initial_actor(config, env, prompt, max_turns, seed)
        if config.lora_rank > 0:
            model = with_lora(model, config, checkpoint)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(torch_device(config.device)), tokenizer


class Reference:
    """π_ref, frozen: the actor with its LoRA adapters disabled (no copy), or a separate copy of the initial actor."""

    def __init__(self, actor: Any, frozen: Any | None):
        self.actor = actor
        self.frozen = frozen

    @classmethod
    def build(
        cls, actor: Any, config: ActorConfig, env: Environment, prompt: PromptConfig, max_turns: int, seed: int
    ) -> Reference:
        if config.lora_rank > 0:
            return cls(actor, None)
        model, _ = initial_actor(config, env, prompt, max_turns, seed)
        model = model.to(torch_device(config.device)).eval().requires_grad_(False)
        return cls(actor, model)

    def logprobs(
        self, rows: Sequence[Row], pad_id: int, temperature: float, micro_batch_size: int, share: bool = True
    ) -> list[Tensor]:
        if self.frozen is not None:
            return rows_logprobs(self.frozen, rows, pad_id, temperature, micro_batch_size, share=share)
        with self.actor.disable_adapter():
            return rows_logprobs(self.actor, rows, pad_id, temperature, micro_batch_size, share=share)


# ---- demonstrations in the actor's own format ------------------------------------------------------------------------
class Demonstrator:
    """A policy that acts like the (ε-noisy) expert but records each step as the actor would have produced it: the
    actor's prompt ids and the action's token ids followed by the end-of-turn token. Keeps the rendered texts so
    their vocabulary can be checked."""

    def __init__(self, actor: LMPolicy, epsilon: float = 0.0, seed: int = 0):
        self.actor = actor
        self.expert = NoisyExpertPolicy(epsilon, seed=seed)
        self.name = f"demo-{self.expert.name}"
        self.texts: list[str] = []

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        tokenizer = self.actor.tokenizer
        actions = []
        for episode, expert in zip(episodes, self.expert.act(episodes)):
            messages = self.actor.prompt_messages(episode)
            self.texts += [
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                expert.text,
            ]
            response = tokenizer(expert.text, add_special_tokens=False)["input_ids"] + [self.actor.eos_ids[0]]
            actions.append(Action(expert.text, response, None, self.actor.encode(messages)))
        return actions


def unknown_words(tokenizer: Any, texts: Sequence[str]) -> list[str]:
    """The pieces of ``texts`` the tokenizer maps to its unknown token (none for byte-level tokenizers)."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return []
    found = set()
    for text in texts:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        found |= {text[a:b] for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if i == unk}
    return sorted(found)


def demonstrations(
    actor: LMPolicy,
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    max_turns: int,
    *,
    epsilon: float = 0.0,
    seed: int = 0,
) -> list[Trajectory]:
    """Expert episodes recorded in the actor's format; raises if the actor's tokenizer misses a word of them."""
    demonstrator = Demonstrator(actor, epsilon, seed)
    trajectories = run_episodes(make_env, tasks, demonstrator, max_turns=max_turns)
    missing = unknown_words(actor.tokenizer, demonstrator.texts)
    if missing:
        raise ValueError(f"the actor's tokenizer maps these prompt/action words to its unknown token: {missing}")
    return trajectories


def behaviour_clone(
    model: Any,
    tokenizer: Any,
    trajectories: Sequence[Trajectory],
    *,
    lr: float = 3e-3,
    epochs: int = 1,
    batch_size: int = 32,
    seed: int = 0,
) -> list[float]:
    """Supervised fine-tuning on demonstrated responses (token-mean negative log-likelihood); returns the losses."""
    rows = step_rows(trajectories)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    rng = random.Random(seed)
    losses = []
    model.train()
    for _ in range(epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for batch_rows in chunks(order, batch_size):
            batch = collate([rows[k] for k in batch_rows], pad, device)
            logprobs, _ = response_logprobs(model, batch, 1.0, entropy_grad=False)
            loss = -token_mean(logprobs, batch.response_mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses
