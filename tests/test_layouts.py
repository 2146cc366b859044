"""The flat token-row layout (verl-agent: one step per row; verl: one conversation per row) gives exactly the
per-token advantages of the per-trajectory layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.credit import CreditConfig, get_estimator
from deltattg.credit.layouts import StepLayoutError, credit_flat, factorize, locate_steps, step_batch, steps_from_ids
from test_credit_properties import FAMILY, batches


def one_step_per_row(tokens: list[list[int]], width: int):
    """verl-agent layout: row = one action, its tokens left-aligned, padding after."""
    mask, traj = [], []
    for i, steps in enumerate(tokens):
        for n in steps:
            row = np.zeros(width, dtype=bool)
            row[:n] = True
            mask.append(row)
            traj.append(i)
    return torch.tensor(np.array(mask)), traj


def conversation_rows(tokens: list[list[int]], rng: np.random.Generator, rows_per_traj: int = 2):
    """verl agent-loop layout: each row holds whole turns separated by masked environment tokens."""
    rows, traj = [], []
    for i, steps in enumerate(tokens):
        chunks = np.array_split(np.arange(len(steps)), rows_per_traj)
        for chunk in chunks:
            row: list[bool] = [False] * int(rng.integers(0, 3))
            for t in chunk:
                row += [True] * steps[t] + [False] * int(rng.integers(1, 4))
            rows.append(row)
            traj.append(i)
    width = max(len(r) for r in rows)
    mask = torch.tensor([r + [False] * (width - len(r)) for r in rows])
    return mask, traj


def expected_tokens(step_adv: torch.Tensor, tokens: list[list[int]]) -> list[float]:
    return [float(step_adv[i, t]) for i, steps in enumerate(tokens) for t, n in enumerate(steps) for _ in range(n)]


@pytest.mark.parametrize("name", ["grpo", *FAMILY])
@settings(max_examples=25, deadline=None)
@given(data=batches(), seed=st.integers(0, 2**16))
def test_flat_layouts_match_per_trajectory(name, data, seed):
    rewards, successes, groups, tokens, meter, _, config = data  # the flat layouts carry no history ids
    tokens = [[max(n, 1) for n in steps] for steps in tokens]  # a flat row cannot hold an empty action
    batch = step_batch(rewards, successes, groups, tokens, meter)
    reference = get_estimator(name)(batch, config)
    want = expected_tokens(reference.step_advantages, tokens)
    rng = np.random.default_rng(seed)
    for mask, traj in (one_step_per_row(tokens, 45), conversation_rows(tokens, rng)):
        # Interleave the trajectories' rows; each trajectory's rows keep their relative order.
        order = _interleave(traj)
        mask, traj_ids = mask[order], [f"t{traj[r]}" for r in order]
        group_ids = [groups[int(t[1:])] for t in traj_ids]
        per_row = torch.tensor([rewards[int(t[1:])] for t in traj_ids])
        success = torch.tensor([successes[int(t[1:])] for t in traj_ids])
        traj_codes, uniques = factorize(traj_ids)
        permutation = [int(u[1:]) for u in uniques]
        flat_meter = step_batch(rewards, successes, groups, tokens, [meter[i] for i in permutation]).meter
        adv, _, _ = credit_flat(name, mask, group_ids, traj_ids, per_row, success, config, flat_meter)
        got = {}
        for row in range(mask.shape[0]):
            got.setdefault(int(traj_ids[row][1:]), []).extend(adv[row][mask[row]].tolist())
        flat = [x for i in range(len(tokens)) for x in got[i]]
        assert flat == pytest.approx(want, rel=1e-5, abs=1e-6)


def conversation_rows_with_ids(tokens: list[list[int]], rng: np.random.Generator):
    """verl's agent loop with explicit step ids: one row per trajectory, consecutive actions sometimes with no
    environment token between them (runs of 1s merge; only the ids tell the steps apart)."""
    rows = []
    for steps in tokens:
        row: list[int] = [-1] * int(rng.integers(0, 3))
        for t, n in enumerate(steps):
            row += [t] * n + [-1] * int(rng.integers(0, 3))
        rows.append(row)
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [-1] * (width - len(r)) for r in rows])
    return ids >= 0, ids


@pytest.mark.parametrize("name", ["grpo", *FAMILY])
@settings(max_examples=25, deadline=None)
@given(data=batches(), seed=st.integers(0, 2**16))
def test_explicit_step_ids_match_per_trajectory_in_any_row_order(name, data, seed):
    rewards, successes, groups, tokens, meter, _, config = data  # the flat layouts carry no history ids
    tokens = [[max(n, 1) for n in steps] for steps in tokens]
    reference = get_estimator(name)(step_batch(rewards, successes, groups, tokens, meter), config)
    rng = np.random.default_rng(seed)
    mask, ids = conversation_rows_with_ids(tokens, rng)
    order = rng.permutation(len(tokens)).tolist()  # rows reordered as verl's _balance_batch may reorder them
    traj_ids = [f"t{i}" for i in order]
    readings = [meter[i] for i in order]  # trajectories in order of first appearance
    adv, _, _ = credit_flat(name, mask[order], [groups[i] for i in order], traj_ids,
                            torch.tensor([rewards[i] for i in order]), torch.tensor([successes[i] for i in order]),
                            config, readings, step_ids=ids[order])  # fmt: skip
    for row, i in enumerate(order):
        want = [float(reference.step_advantages[i, t]) for t in ids[i][ids[i] >= 0].tolist()]
        assert adv[row][mask[i]].tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_step_ids_must_agree_with_the_mask_and_count_from_zero():
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    with pytest.raises(StepLayoutError, match="trajectory b: response token 1 of row 1 has step id 0 but response mask 0"):
        steps_from_ids(torch.tensor([[0, 0, -1, 1], [0, 0, -1, -1]]), mask, torch.tensor([0, 1]), ["a", "b"])
    with pytest.raises(StepLayoutError, match="trajectory a: step 1 has no tokens but later steps do"):
        steps_from_ids(torch.tensor([[0, 0, -1, 2], [0, -1, -1, -1]]), mask, torch.tensor([0, 1]), ["a", "b"])
    steps = steps_from_ids(torch.tensor([[0, 1, -1, 2], [0, -1, -1, -1]]), mask, torch.tensor([0, 1]))
    assert steps.step_tokens.tolist() == [[1, 1, 1], [1, 0, 0]]  # adjacent actions stay two steps


def test_readings_that_do_not_line_up_with_the_located_steps_name_the_trajectory():
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 0]])
    config = CreditConfig(failure_cost=100.0)
    ok = [[None, None], [None, None]]
    credit_flat("deltattg", mask, ["g", "g"], ["a", "b"], torch.tensor([1.0, 0.0]), torch.tensor([True, False]),
                config, ok)  # fmt: skip
    # Two adjacent actions with no observation token between them merge into one run of 1s: only step ids tell.
    with pytest.raises(StepLayoutError, match="trajectory b: 2 steps located in the batch but 3 expected"):
        credit_flat("deltattg", mask, ["g", "g"], ["a", "b"], torch.tensor([1.0, 0.0]), torch.tensor([True, False]),
                    config, [[None, None], [None, None, None]])  # fmt: skip


def _interleave(traj: list[int]) -> list[int]:
    """Row order that round-robins over trajectories while keeping each trajectory's rows in order."""
    queues: dict[int, list[int]] = {}
    for row, t in enumerate(traj):
        queues.setdefault(t, []).append(row)
    order: list[int] = []
    while any(queues.values()):
        for t in sorted(queues, reverse=True):
            if queues[t]:
                order.append(queues[t].pop(0))
    return order


def test_locate_steps_numbers_runs_across_rows():
    mask = torch.tensor(
        [
            [1, 1, 0, 1, 0, 0],  # trajectory a: steps 0, 1
            [0, 1, 1, 1, 0, 1],  # trajectory b: steps 0, 1
            [1, 0, 0, 0, 0, 0],  # trajectory a: step 2
        ]
    )
    steps = locate_steps(mask, torch.tensor([0, 1, 0]))
    # Runs in row-major order: (row 0: a0, a1), (row 1: b0, b1), (row 2: a2).
    assert steps.token_step.tolist() == [[0, 0, -1, 1, -1, -1], [-1, 0, 0, 0, -1, 1], [2, -1, -1, -1, -1, -1]]
    assert steps.step_tokens.tolist() == [[2, 1, 1], [3, 1, 0]]
    assert steps.step_mask.tolist() == [[True, True, True], [True, True, False]]


def test_factorize_keeps_first_appearance_order():
    codes, uniques = factorize(np.array(["b", "a", "b", "c"], dtype=object))
    assert codes.tolist() == [0, 1, 0, 2] and uniques == ["b", "a", "c"]
