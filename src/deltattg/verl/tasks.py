"""verl's training data for the ``deltattg_env`` agent loop: one parquet row per environment task.

verl's ``RLHFDataset`` reads a parquet file of prompts; here each row names a task instead. ``prompt`` holds the
task's first chat messages (verl filters and logs by it), ``agent_name`` selects the agent loop and
``extra_info.deltattg_task`` is the task as JSON — the environment's ``describe()`` and the task's id, split and data —
from which the agent loop rebuilds the environment in verl's worker (:func:`deltattg.verl.agent_loop.task_of`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltattg.envs.base import Describable, Environment

AGENT_NAME = "deltattg_env"
TASK_FIELD = "deltattg_task"  # key of the task inside a row's extra_info


def task_rows(make_env: Callable[[], Environment], split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The dataset rows of the first ``limit`` tasks of ``split`` (all by default)."""
    env = make_env()
    if not isinstance(env, Describable):
        raise ValueError(f"the {env.name!r} environment cannot describe itself, so verl's workers cannot rebuild it")
    description = env.describe()
    rows = []
    for index, task in enumerate(list(env.tasks(split))[:limit]):
        observation = env.reset(task)
        spec = {"env": description, "task": {"id": task.id, "split": task.split, "data": task.data}}
        rows.append({
            "data_source": f"deltattg/{env.name}",
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": observation}],
            "reward_model": {"style": "environment", "ground_truth": ""},
            "extra_info": {"index": index, "split": split, TASK_FIELD: json.dumps(spec)},
        })  # fmt: skip
    return rows


def write_parquet(rows: list[dict[str, Any]], out: str | os.PathLike) -> None:
    """Write ``rows`` as one parquet file, atomically (a partial file never appears at ``out``)."""
    import datasets

    out = Path(out)
    partial = out.with_name(f".{out.name}.partial")
    try:
        datasets.Dataset.from_list(rows).to_parquet(str(partial))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def task_of(extra_info: Any) -> dict[str, Any]:
    """The ``{"env": ..., "task": ...}`` spec a row's ``extra_info`` carries (``ValueError`` naming what is wrong)."""
    raw = extra_info.get(TASK_FIELD) if isinstance(extra_info, dict) else None
    try:
        spec = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as error:
        raise ValueError(f"dataset row: extra_info.{TASK_FIELD} is not JSON ({error})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("env"), dict) or not isinstance(spec.get("task"), dict) \
            or "id" not in spec["task"]:  # fmt: skip
        raise ValueError(f"dataset row: extra_info.{TASK_FIELD} must be {{'env': {{...}}, 'task': {{'id': ...}}}} "
                         "(write the dataset with `deltattg verl-tasks`)")  # fmt: skip
    return spec
