"""verl's training data for the ``deltattg_env`` agent loop: one parquet row per environment task.

verl's ``RLHFDataset`` reads a parquet file of prompts; here each row names a task instead. ``prompt`` holds the
task's first chat messages (verl filters and logs by it; the agent loop builds the actor's prompts itself, from the
environment): the system prompt and the first observation — or, for an environment whose reset is costly and that
states its task without one (``StatesTask``: ALFWorld, whose games load in seconds), the task's text. ``agent_name``
selects the agent loop and
``extra_info.deltattg_task`` is the task as JSON — the environment's ``describe()`` and the task's id, split and data —
from which the agent loop rebuilds the environment in verl's worker (:func:`rebuild_task`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from deltattg.data.jsonl import atomic_output
from deltattg.envs.base import Describable, Environment, StatesTask, Task
from deltattg.envs.registry import rebuild

AGENT_NAME = "deltattg_env"
TASK_FIELD = "deltattg_task"  # key of the task inside a row's extra_info


def task_rows(make_env: Callable[[], Environment], split: str, limit: int | None = None,
              progress: bool = False) -> list[dict[str, Any]]:
    """The dataset rows of the first ``limit`` tasks of ``split`` (all by default); ``progress`` draws a bar."""
    from tqdm.auto import tqdm

    env = make_env()
    if not isinstance(env, Describable):
        raise ValueError(f"the {env.name!r} environment cannot describe itself, so verl's workers cannot rebuild it")
    description = env.describe()
    rows = []
    tasks = list(env.tasks(split))[:limit]
    for index, task in enumerate(tqdm(tasks, desc=f"{env.name} {split}", unit="task", disable=not progress)):
        observation = env.task_text(task) if isinstance(env, StatesTask) else env.reset(task)
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
    """Write ``rows`` as one parquet file, atomically (``atomic_output``: a partial file never appears at ``out``; an
    unwritable ``out`` is an ``InputError`` naming it)."""
    import datasets

    with atomic_output(out, binary=True) as handle:
        datasets.Dataset.from_list(rows).to_parquet(handle)


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


def rebuild_task(extra_info: Any) -> tuple[Environment, Task]:
    """The environment (rebuilt from its description) and the task a dataset row's ``extra_info`` names: what the
    ``deltattg_env`` agent loop plays (``ValueError`` naming what is wrong)."""
    spec = task_of(extra_info)
    task = spec["task"]
    env = rebuild(spec["env"])()
    return env, Task(str(task["id"]), str(task.get("split", "train")), dict(task.get("data") or {}))
