"""Policies: an HF causal LM (batched sampling with log-probs), an ε-noisy expert and a random policy."""

from __future__ import annotations

import copy
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deltattg.envs.base import HasExpert, HasMistakes
from deltattg.hf import cache_argument, common_prefix_length
from deltattg.rollout.engine import Action, Episode
from deltattg.rollout.prompts import PromptConfig, episode_prompt, parse_react_action
from deltattg.rollout.random_calls import HasToolCalls, random_reply
from deltattg.settings import setting


class RandomPolicy:
    """A uniformly random admissible action; where the environment lists none but its actions are tool calls (BFCL,
    τ²: :class:`~deltattg.rollout.random_calls.HasToolCalls`), a random tool call with arguments drawn from the
    tool's schema, or a random call-free reply (:func:`~deltattg.rollout.random_calls.random_reply`); ``look``
    elsewhere."""

    def __init__(self, seed: int = 0, name: str = "random"):
        self.name = name
        self.rng = random.Random(seed)

    def _one(self, episode: Episode) -> Action:
        if episode.admissible:
            return Action(self.rng.choice(episode.admissible))
        if isinstance(episode.env, HasToolCalls):
            shown = [episode.first_observation, *(observation for _, observation in episode.history)]
            return Action(random_reply(episode.env, shown, self.rng))
        return Action("look")

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        return [self._one(e) for e in episodes]


class NoisyExpertPolicy:
    """The environment's expert action; with probability ε a mistake instead: a random admissible action, or, where
    the environment lists none, its ``mistaken_action`` (BFCL, τ²: a wrong argument, the wrong tool, giving up;
    :mod:`deltattg.envs.mistakes`). Paper D.1's "diverse policies": experts of several noise levels plus weaker
    models."""

    def __init__(self, epsilon: float, seed: int = 0, name: str | None = None):
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = epsilon
        self.name = name or f"expert-eps{epsilon:g}"
        self.rng = random.Random(seed)

    def _one(self, episode: Episode) -> Action:
        """A mistake with probability ε, decided first: the expert (a planner on ALFWorld) is asked only when followed."""
        if not isinstance(episode.env, HasExpert):
            raise TypeError(f"environment {episode.env.name!r} has no expert")
        can_err = bool(episode.admissible) or isinstance(episode.env, HasMistakes)
        if can_err and self.rng.random() < self.epsilon:
            if episode.admissible:
                return Action(self.rng.choice(episode.admissible), mistake=True)
            return Action(episode.env.mistaken_action(self.rng), mistake=True)  # type: ignore[union-attr]
        expert = episode.env.expert_action()
        if expert is None:  # no expert action here: neither the expert's nor a deliberate mistake
            return Action(self.rng.choice(episode.admissible) if episode.admissible else "look")
        return Action(expert, mistake=False)

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        return [self._one(e) for e in episodes]


@dataclass(frozen=True)
class SamplingConfig:
    """Actor decoding (Table 4: temperature 1.0, top-p 1.0; max tokens per turn per preset). ``temperature=0``: greedy."""

    temperature: float = setting(1.0, "lm actors: sampling temperature (0 = greedy)")
    top_p: float = 1.0
    max_new_tokens: int = 64
    batch_size: int = 64
    max_prompt_tokens: int | None = None
    share_prompts: bool = True  # prefill each distinct prompt of a batch once (``shared_prefill``)
    prefix_cache: int = setting(0, "in-process lm actors: generate one prompt at a time, keeping the key/values of "
                                "the N most recent conversations so a prompt is prefilled only past the prefix it "
                                "shares with one (the next turn; the same system prompt). Worth it on CPU with long "
                                "prompts (bfcl, tau2); 0: batched, no reuse")


class ChatPolicy:
    """An LM actor that reads the episode through its tokenizer's chat template (window or chat layout) and acts with
    whatever its backend samples; subclasses implement ``generate(prompt_ids) -> actions``. With ``prompt.react`` (the
    ReAct baseline) each action keeps the whole reply as its text and sends the environment only its last
    ``Action:`` part (``prompts.parse_react_action``)."""

    def __init__(self, tokenizer: Any, sampling: SamplingConfig, prompt: PromptConfig, name: str):
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.prompt = prompt
        self.name = name

    def prompt_messages(self, episode: Episode) -> list[dict]:
        return episode_prompt(episode, self.prompt)

    def encode(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        limit = self.sampling.max_prompt_tokens
        return ids[-limit:] if limit else ids

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        actions = self.generate_all([self.encode(self.prompt_messages(e)) for e in episodes])
        if self.prompt.react:
            for action in actions:
                action.env_text = parse_react_action(action.text)
        return actions

    def generate_all(self, prompts: list[list[int]]) -> list[Action]:
        """One reply per prompt, generated in batches of ``sampling.batch_size``."""
        size = self.sampling.batch_size
        replies: list[Action] = []
        for start in range(0, len(prompts), size):
            replies += self.generate(prompts[start : start + size])
        return replies

    def generate(self, prompts: list[list[int]]) -> list[Action]:
        raise NotImplementedError


class LMPolicy(ChatPolicy):
    """An HF causal LM acting through its chat template; records token ids and log-probs of what it sampled.

    Log-probs are log softmax(logits / T) at the sampled tokens (T = 1 when greedy), i.e. the sampling distribution
    before top-p truncation — what a fresh forward pass of the same model recomputes for the PPO ratio.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingConfig = SamplingConfig(),
        prompt: PromptConfig = PromptConfig(),
        name: str = "lm",
    ):
        super().__init__(tokenizer, sampling, prompt, name)
        self.model = model
        self.eos_ids = _eos_ids(model, tokenizer)
        self.prefixes = PrefixCache(sampling.prefix_cache) if sampling.prefix_cache > 0 else None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> list[Action]:
        """Sample one response per prompt (left-padded batch); cut each at its first end-of-turn token (kept). Each
        distinct prompt is read once (``shared_prefill``): the G rollouts of a task start from one prompt. With
        ``sampling.prefix_cache`` the prompts go one at a time instead, each prefilled only past the longest prefix
        it shares with a recent conversation (:class:`PrefixCache`)."""
        if self.prefixes is not None:
            return [self.generate_reusing_prefix(prompt) for prompt in prompts]
        s = self.sampling
        pad = self.pad_id
        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        cache = shared_prefill(self.model, prompts, input_ids, attention) if s.share_prompts else {}
        generated, logprobs, _ = self.sample(input_ids, attention, cache, pad)
        return [self.action(prompt, generated[row], logprobs[row]) for row, prompt in enumerate(prompts)]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]

    def action(self, prompt: list[int], generated: torch.Tensor, logprobs: torch.Tensor) -> Action:
        """One row's reply, cut after its first end-of-turn token (kept)."""
        ids = generated.tolist()
        length = next((k + 1 for k, t in enumerate(ids) if t in self.eos_ids), len(ids))
        text = self.tokenizer.decode(ids[:length], skip_special_tokens=True).strip()
        return Action(text, ids[:length], logprobs[:length].tolist(), list(prompt))

    def generate_reusing_prefix(self, prompt: list[int]) -> Action:
        """One reply to ``prompt``, prefilled only past its longest shared prefix with a cached conversation; the
        conversation (prompt + reply) is cached for the next turn."""
        assert self.prefixes is not None
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([prompt], device=device)
        cache, _ = self.prefixes.lookup(prompt)
        name = cache_argument(self.model)
        generated, logprobs, kept = self.sample(input_ids, torch.ones_like(input_ids), {name: cache} if cache else {},
                                                self.pad_id, keep_cache=True)  # fmt: skip
        seen = [*prompt, *generated[0].tolist()]
        self.prefixes.store(seen[: kept.get_seq_length()], kept)
        return self.action(prompt, generated[0], logprobs[0])

    def sample(
        self, input_ids: torch.Tensor, attention: torch.Tensor, cache: dict[str, Any], pad: int,
        keep_cache: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:  # fmt: skip
        """``generate`` over a left-padded batch: the new token ids and their log-probs, both ``[rows, new tokens]``
        (rows that ended early continue with ``pad``), and with ``keep_cache`` the key/value cache it ended with
        (else None). The log-probs are taken step by step (:class:`SampledLogprobs`), so no more than one step's
        ``[rows, vocabulary]`` distribution is kept."""
        s = self.sampling
        greedy = s.temperature <= 0
        recorder = SampledLogprobs(1.0 if greedy else s.temperature)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            **cache,
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None,
            max_new_tokens=s.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=self.eos_ids,
            logits_processor=[recorder],
            return_dict_in_generate=keep_cache,
        )
        sequences = out.sequences if keep_cache else out
        generated = sequences[:, input_ids.shape[1] :]
        return generated, recorder.logprobs(generated), getattr(out, cache_argument(self.model)) if keep_cache else None


class PrefixCache:
    """Key/value caches of the ``size`` most recently generated conversations (prompt and reply), so that a prompt
    extending one of them — the next turn of the same episode, or another episode with the same system prompt — is
    prefilled only past the shared prefix: prefix caching, as vLLM does on a server, for in-process HF actors on CPU,
    where a BFCL or τ² prompt of 6,000 tokens would otherwise be read again at every turn."""

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    def lookup(self, prompt: Sequence[int]) -> tuple[Any, int]:
        """A copy of the cache sharing the longest prefix with ``prompt``, cropped to that prefix (at most all but
        the prompt's last token, which ``generate`` must read), and its length; ``(None, 0)`` when none shares any."""
        best, length = None, 0
        for ids in self.entries:
            shared = common_prefix_length(ids, prompt)
            if shared > length:
                best, length = ids, shared
        length = min(length, len(prompt) - 1)
        if best is None or length <= 0:
            return None, 0
        self.entries.move_to_end(best)
        cache = copy.deepcopy(self.entries[best])
        cache.crop(length - cache.get_seq_length())
        return cache, length

    def store(self, ids: Sequence[int], cache: Any) -> None:
        """Keep ``cache`` (the key/values of ``ids``), dropping the least recently used beyond ``size``."""
        self.entries[tuple(ids)] = cache
        self.entries.move_to_end(tuple(ids))
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


class SampledLogprobs:
    """A ``transformers`` logits processor (duck-typed: transformers is imported lazily) that records the log-prob of
    each sampled token, log softmax(scores / T), keeping one step's ``[rows, vocabulary]`` distribution at a time.

    ``generate`` calls it once per new token with the ids so far and that step's fp32 logits: after its own
    non-warper processors (a repetition penalty, a minimum length, ... — ``LMPolicy`` asks for none), before the
    temperature and top-p warpers. Each call reads the token the previous step sampled (``input_ids[:, -1]``) from
    that step's log-softmax and keeps the new step's; :meth:`logprobs` reads the last token after ``generate``.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.taken: list[torch.Tensor] = []  # [rows] log-probs of the tokens sampled before the current step
        self.current = torch.empty(0)  # [rows, vocabulary] log-softmax of the current step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.current.numel():
            self.taken.append(self.current.gather(-1, input_ids[:, -1:])[:, 0])
        self.current = torch.log_softmax(scores / self.temperature, dim=-1)
        return scores

    def logprobs(self, generated: torch.Tensor) -> torch.Tensor:
        """``[rows, new tokens]`` log-probs of ``generated``, the new ids ``generate`` returned (which may have
        dropped one extra step it ran, as its deferred stop check does on mps: hence the cut)."""
        taken = [*self.taken, self.current.gather(-1, generated[:, -1:])[:, 0]]
        return torch.stack(taken[: generated.shape[1]], dim=1)


def shared_prefill(model: Any, prompts: Sequence[Sequence[int]], input_ids: Any, attention: Any) -> dict[str, Any]:
    """The key/value cache of every left-padded prompt but its last token, each distinct prompt computed once and
    copied to the rows that repeat it, as ``generate``'s cache argument ({} where no prompt repeats or a prompt is a
    single token). ``generate`` then reads only the last prompt token before sampling."""
    index: dict[tuple[int, ...], int] = {}
    prompt_of = [index.setdefault(tuple(p), len(index)) for p in prompts]
    if len(index) == len(prompts) or input_ids.shape[1] < 2:
        return {}
    first = [prompt_of.index(k) for k in range(len(index))]
    mask = attention[first, :-1]
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate numbers a left-padded prompt
    name = cache_argument(model)
    cache = model(input_ids=input_ids[first, :-1], attention_mask=mask, position_ids=positions, use_cache=True)[name]
    cache.batch_select_indices(torch.tensor(prompt_of, device=input_ids.device))
    return {name: cache}


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the generation config's eos ids and the tokenizer's eos."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model has no end-of-sequence token id")
    return ids
