"""Token rows as verl-agent holds them: one row per step — the exact prompt the actor saw, then its response — and the
actor's per-token log-probabilities (and entropies) of the responses.

A batch of rows is laid out like verl's: prompts left-padded to ``P``, responses right-padded to ``L``, so response
token k of every row sits at position ``P + k`` and a ``[rows, L]`` response mask lines up with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from deltattg.data.trajectory import Trajectory


@dataclass(frozen=True)
class Row:
    """Step ``step`` of trajectory ``traj``: the prompt ids and the response ids (the loss is on the response)."""

    prompt: list[int]
    response: list[int]
    traj: int
    step: int


def step_rows(trajectories: Sequence[Trajectory]) -> list[Row]:
    rows = []
    for i, trajectory in enumerate(trajectories):
        for t, step in enumerate(trajectory.steps or []):
            if step.prompt_ids is None or step.token_ids is None:
                raise ValueError(f"trajectory {trajectory.id} step {t} lacks prompt_ids/token_ids (not an LM rollout)")
            rows.append(Row(step.prompt_ids, step.token_ids, i, t))
    return rows


@dataclass
class TokenBatch:
    input_ids: Tensor  # [B, P + L]
    attention_mask: Tensor  # [B, P + L]
    position_ids: Tensor  # [B, P + L]
    response_mask: Tensor  # [B, L]

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]


def collate(rows: Sequence[Row], pad_id: int, device: torch.device | str = "cpu") -> TokenBatch:
    """Left-pad the prompts, right-pad the responses; positions count real tokens only (as an unpadded pass sees them)."""
    prompt_width = max(len(r.prompt) for r in rows)
    response_width = max(len(r.response) for r in rows)
    ids, mask, response_mask = [], [], []
    for r in rows:
        left, right = prompt_width - len(r.prompt), response_width - len(r.response)
        ids.append([pad_id] * left + r.prompt + r.response + [pad_id] * right)
        mask.append([0] * left + [1] * (len(r.prompt) + len(r.response)) + [0] * right)
        response_mask.append([1] * len(r.response) + [0] * right)
    attention = torch.tensor(mask, device=device)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return TokenBatch(
        torch.tensor(ids, device=device), attention, positions, torch.tensor(response_mask, device=device)
    )


def pad_responses(values: Sequence[Tensor], width: int) -> Tensor:
    """Per-row 1-D token values -> ``[B, width]``, zero-padded on the right."""
    out = torch.zeros(len(values), width, dtype=values[0].dtype, device=values[0].device)
    for k, v in enumerate(values):
        out[k, : len(v)] = v
    return out


def response_logprobs(
    model: Any, batch: TokenBatch, temperature: float, *, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    """log π(a_k | z_k) of every response token under softmax(logits / T) (Eq. 15's numerator, as verl recomputes it)
    and the entropy of that distribution; ``[B, L]`` each, 0 at padding. Only the L + 1 last logits are computed."""
    length = batch.response_length
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=length + 1,
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    targets = batch.input_ids[:, -length:]
    logprobs = logp.gather(-1, targets[..., None])[..., 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp.exp() * logp).sum(-1)
    mask = batch.response_mask.bool()
    return logprobs.masked_fill(~mask, 0.0), entropy.masked_fill(~mask, 0.0)


def chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


@torch.no_grad()
def rows_logprobs(
    model: Any, rows: Sequence[Row], pad_id: int, temperature: float, micro_batch_size: int
) -> list[Tensor]:
    """Each row's response log-probs under ``model`` (no gradient): old log-probs θ_old and reference log-probs."""
    device = next(model.parameters()).device
    out: list[Tensor] = []
    for micro in chunks(range(len(rows)), micro_batch_size):
        batch = collate([rows[k] for k in micro], pad_id, device)
        logprobs, _ = response_logprobs(model, batch, temperature, entropy_grad=False)
        out += [logprobs[j, : len(rows[k].response)].cpu() for j, k in enumerate(micro)]
    return out
