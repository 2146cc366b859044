"""The generative meter's answers to every decision state of a trajectory on one shared key/value cache.

The meter's prompt for h_t is a prefix of its prompt for h_{t+1} up to where the history ends (the instruction, the
task and the turns so far, each closed by the turns left, come first; only the short *closing* — the end-of-history
delimiter and the chat template's end of turn, 10 tokens on SmolLM2 — follows). So a trajectory's prompts are read as
a tree: the longest prompt (its *base*) is prefilled once, and each state's prompt adds only the tokens it does not
share with the base. Where the meter's window drops old turns, the base no longer holds a prompt's history; that
prompt then starts a base of its own (:func:`plan_bases`), which reuses the cache of what the two share.

All rows of a base decode together, one forward pass per generated token, each row attending only to its own tokens
and to the base up to where its prompt leaves it (a custom 4-D attention mask over one growing cache, so no row's
cache is copied). The answer prefix ``{"can_complete":`` is fed with the prompt as a *draft* verified greedily
(speculative decoding with greedy acceptance: a row keeps the draft tokens the model would have written itself), so
the E.4 logit (Eq. 19) is read in the same pass, and a trained meter spends no decoding step on its fixed prefix.
Greedy answers equal per-prefix generation up to float rounding (the same tokens at the same positions).

On CPU the decoder swaps transformers' SDPA attention for :func:`sdpa_sharing_kv_heads` while it reads (the same
kernel, handed the key/value heads as they are instead of repeated for every query head under the tree mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from deltattg.hf import common_prefix_length

SDPA_SHARING_KV_HEADS = "deltattg_sdpa_sharing_kv_heads"  # the name it is registered under in transformers


def sdpa_sharing_kv_heads(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except on CPU under a mask with fewer key/value heads than query heads: there
    transformers repeats every layer's keys and values for each query head before SDPA (a copy of the whole cache per
    layer per forward pass; CUDA's fused kernels take no mask with grouped heads), while PyTorch's CPU kernel reads
    the grouped heads as they are (``enable_gqa``) — the same sums, 7 % of the shared-prefix decoder's time on
    SmolLM2 (9 query heads over 3 key/value heads)."""
    if attention_mask is None or query.device.type != "cpu" or getattr(module, "num_key_value_groups", 1) == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"),
        enable_gqa=True)  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SDPA_SHARING_KV_HEADS, sdpa_sharing_kv_heads)
AttentionMaskInterface.register(SDPA_SHARING_KV_HEADS, sdpa_mask)


def plan_bases(prompts: Sequence[Sequence[int]], needed: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``[(base, rows)]``: the prompts (indices) read on the cache of prompt ``base``, walking from the last prompt
    back; prompt k joins the current base when it shares at least its first ``needed[k]`` ids with it (its whole
    history: only its closing is its own), else it becomes the next base. Every prompt is in exactly one group;
    groups come in the order of the prompts."""
    groups: list[tuple[int, list[int]]] = []
    for k in reversed(range(len(prompts))):
        if not groups or common_prefix_length(prompts[k], prompts[groups[-1][0]]) < needed[k]:
            groups.append((k, []))
        groups[-1][1].insert(0, k)
    return groups[::-1]


@dataclass
class Row:
    """One prompt answered on the shared cache: its first ``cached`` ids are the base's; ``pending`` are the rest of
    its prompt; ``draft`` the tokens fed after it (the logit context's rest), kept only as far as greedy agrees."""

    cached: int
    pending: list[int]
    draft: list[int] = field(default_factory=list)
    answer: list[int] = field(default_factory=list)  # greedy answer ids, a stop token last if one was written
    draft_logprobs: torch.Tensor | None = None  # log-softmax after the whole draft (the E.4 readout's position)


@dataclass
class PrefixStats:
    """Tokens the model read: ``prefilled`` (base tokens, then each row's pending tokens), ``drafted`` (draft tokens
    fed) and ``decoded`` (one per decoding step per row)."""

    prefilled: int = 0
    drafted: int = 0
    decoded: int = 0


class SharedPrefixDecoder:
    """Greedy answers of many prompts that share prefixes, over one key/value cache that persists between calls (the
    meter's instruction, and a group's task, are read once for all trajectories that follow). A context manager:
    inside it a model on SDPA attention uses :func:`sdpa_sharing_kv_heads`."""

    def __init__(self, model: Any, *, max_new_tokens: int, stop_ids: Sequence[int], max_batch_tokens: int = 4096):
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.stop_ids = set(stop_ids)
        self.max_batch_tokens = max_batch_tokens
        self.cache: Any = None
        self.cached_ids: list[int] = []
        self.stats = PrefixStats()
        self._attention = model.config._attn_implementation  # restored on leaving the context

    def __enter__(self) -> SharedPrefixDecoder:
        if self._attention == "sdpa":
            self.model.set_attn_implementation(SDPA_SHARING_KV_HEADS)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._attention == "sdpa":
            self.model.set_attn_implementation("sdpa")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, ids: list[int], positions: list[int], mask: torch.Tensor | None, keep: Any = 1) -> Any:
        from deltattg.hf import cache_argument

        name = cache_argument(self.model)
        inputs = torch.tensor([ids], device=self.device)
        kwargs: dict[str, Any] = {name: self.cache, "use_cache": True, "logits_to_keep": keep}
        if mask is not None:
            dtype = next(self.model.parameters()).dtype
            kwargs["attention_mask"] = torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(
                ~mask.to(self.device), torch.finfo(dtype).min)[None, None]  # fmt: skip
        out = self.model(input_ids=inputs, position_ids=torch.tensor([positions], device=self.device), **kwargs)
        self.cache = out[name]
        return out.logits[0].float()

    def prefill(self, ids: Sequence[int]) -> None:
        """Make the cache hold exactly ``ids``, reading only what it does not already share with them."""
        keep = common_prefix_length(self.cached_ids, ids)
        if keep == 0:
            self.cache = None
        else:
            self._crop(keep)
        if len(ids) > keep:
            self._forward(list(ids[keep:]), list(range(keep, len(ids))), None)
            self.stats.prefilled += len(ids) - keep
        self.cached_ids = list(ids)

    @torch.inference_mode()
    def answer(self, rows: Sequence[Row], *, decode: bool = True) -> None:
        """Fill each row's ``answer`` (greedy, at most ``max_new_tokens``; with ``decode=False`` only the draft is
        verified) and ``draft_logprobs``, on the cache of :attr:`cached_ids` (each row's first ``cached`` ids);
        rows go in groups of at most ``max_batch_tokens`` fed tokens. The cache holds the same ids afterwards."""
        group: list[Row] = []
        for row in rows:
            if group and sum(len(r.pending) + len(r.draft) for r in [*group, row]) > self.max_batch_tokens:
                self._answer_group(group, decode)
                group = []
            group.append(row)
        if group:
            self._answer_group(group, decode)

    def _answer_group(self, rows: Sequence[Row], decode: bool) -> None:
        base = len(self.cached_ids)
        tokens, positions, owner, kept = [], [], [], []
        for r, row in enumerate(rows):
            fed = row.pending + row.draft
            kept += range(len(tokens) + len(row.pending) - 1, len(tokens) + len(fed))  # predictions of answer tokens
            tokens += fed
            positions += range(row.cached, row.cached + len(fed))
            owner += [r] * len(fed)
        self.stats.prefilled += sum(len(row.pending) for row in rows)
        self.stats.drafted += sum(len(row.draft) for row in rows)
        who = torch.tensor(owner)
        order = torch.arange(len(tokens))
        sees_base = torch.arange(base)[None, :] < torch.tensor([row.cached for row in rows])[:, None]
        sees_own = (who[:, None] == who[None, :]) & (order[None, :] <= order[:, None])
        logits = self._forward(tokens, positions, torch.cat([sees_base[who], sees_own], 1),
                               keep=torch.tensor(kept, device=self.device))  # fmt: skip
        visible = torch.zeros(len(rows), base + len(tokens), dtype=torch.bool)
        visible[:, :base] = sees_base
        at = 0
        for r, row in enumerate(rows):
            predicted = logits[at : at + len(row.draft) + 1]
            at += len(row.draft) + 1
            row.draft_logprobs = torch.log_softmax(predicted[-1], dim=-1)
            greedy = predicted.argmax(-1).tolist()
            accepted = common_prefix_length(greedy, row.draft)
            row.answer = self._cut([*row.draft[:accepted], greedy[accepted]])
            start = base + sum(len(x.pending) + len(x.draft) for x in rows[:r])
            visible[r, start : start + len(row.pending) + min(accepted, len(row.answer))] = True
        active = [r for r, row in enumerate(rows) if decode and not self._done(row.answer)]
        while active:
            mask = torch.cat([visible[active], torch.eye(len(active), dtype=torch.bool)], 1)
            fed = [rows[r].answer[-1] for r in active]
            where = [rows[r].cached + len(rows[r].pending) + len(rows[r].answer) - 1 for r in active]
            step = self._forward(fed, where, mask, keep=0).argmax(-1).tolist()
            self.stats.decoded += len(active)
            grown = torch.zeros(len(rows), len(active), dtype=torch.bool)
            grown[active, range(len(active))] = True
            visible = torch.cat([visible, grown], 1)
            for r, token in zip(active, step):
                rows[r].answer = self._cut([*rows[r].answer, token])
            active = [r for r in active if not self._done(rows[r].answer)]
        self._crop(base)

    def _crop(self, length: int) -> None:
        """Keep the cache's first ``length`` positions (transformers' ``crop`` takes how many to remove)."""
        if self.cache is not None and self.cache.get_seq_length() > length:
            self.cache.crop(length - self.cache.get_seq_length())

    def _cut(self, answer: list[int]) -> list[int]:
        """The answer up to its first stop token (kept) and at most ``max_new_tokens`` long."""
        end = next((i + 1 for i, token in enumerate(answer) if token in self.stop_ids), len(answer))
        return answer[: min(end, self.max_new_tokens)]

    def _done(self, answer: list[int]) -> bool:
        return len(answer) >= self.max_new_tokens or (bool(answer) and answer[-1] in self.stop_ids)
