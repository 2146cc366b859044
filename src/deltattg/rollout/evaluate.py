"""``deltattg evaluate``: one actor on an environment split — success, average steps and a per-task-type table (the
paper's Table 7 layout: household and ALFWorld task types; BFCL categories; τ² domains), resumable over a long split.

The output folder holds ``episodes.jsonl`` (one trajectory record per finished episode, ``collect``'s record format
plus ``evaluation``: the run's settings; appended as each episode finishes, so a killed run keeps what it finished),
``results.json`` and ``results.md`` (written atomically at the end). Rerunning the same command on the same folder
plays only the tasks that have no record yet; a folder holding another run's records is refused, and so is a folder
another process is evaluating into right now (``rollout.output.held_folder``: its pid is named). A local model is one
actor however its path is spelled (``lm:DIR``, ``lm:DIR/``, ``lm:./DIR``: ``PolicySpec.resolved``).

Tasks: the split's tasks in an order shuffled by ``seed``, the first ``episodes`` of them (all by default), so a larger
``--episodes`` extends an earlier run. Expert and random actors draw from one random stream per episode, seeded by
``seed`` and the task id, so a resumed run gives exactly the numbers of an uninterrupted one; LM actors sample in
batches (one torch seed per chunk of episodes), so a resumed run replays the interrupted chunk's episodes afresh.

``reflexion:MODEL`` plays each task for up to 3 trials (``rollout.reflexion``): its record is the task's last trial
(its steps are that trial's), with the trials it took; the results add ``trials`` (average used, success within k).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import atomic_output, dumps, read_jsonl
from deltattg.data.trajectory import Trajectory, parse_trajectory
from deltattg.envs.base import Environment, Task
from deltattg.errors import InputError
from deltattg.rollout.collect import PolicySpec, check_episodes, parse_policy
from deltattg.rollout.engine import Action, Episode, Policy, failed_steps, run_episodes, service_warning
from deltattg.rollout.output import held_folder

EPISODES_FILE = "episodes.jsonl"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
SETTINGS_KEY = "evaluation"  # each record's copy of the run's settings
CHUNK = 16  # episodes played together (one batched actor call per turn); each finished one is appended at once

# The paper's Table 7 columns (ALFWorld's task types; the household environment poses the same six) and BFCL's
# multi-turn categories (``deltattg.envs.bfcl.CATEGORIES``; not imported: that module needs bfcl-eval).
ALFWORLD_COLUMNS = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}
BFCL_COLUMNS = {"base": "base", "miss_func": "miss_func", "miss_param": "miss_param", "long_context": "long_context"}
TAU2_COLUMNS = {"retail": "retail", "airline": "airline", "telecom": "telecom"}
COLUMNS = {"household": ALFWORLD_COLUMNS, "alfworld": ALFWORLD_COLUMNS, "bfcl": BFCL_COLUMNS, "tau2": TAU2_COLUMNS}
BREAKDOWN = {"bfcl": "category", "tau2": "domain", "search": "source", "awm": "scenario"}


def breakdown_name(env: str) -> str:
    return BREAKDOWN.get(env, "task type")


def task_type(env: str, task: Task) -> str:
    """What the breakdown groups ``task`` by: its BFCL category (the split it came from), its τ² domain, a search
    question's source (its file's ``data_source``, else its split), an AWM task's scenario, else its task type
    (household, ALFWorld)."""
    if env == "bfcl":
        return task.split
    if env == "search":
        return str(task.data.get("source") or task.split)
    if env == "awm":
        return str(task.data.get("scenario", "unknown"))
    if env == "tau2":
        return str(task.data.get("domain", task.split.partition("/")[0]))
    return str(task.data.get("task_type", "unknown"))


@dataclass(frozen=True)
class EvalSettings:
    """What makes two runs the same run: a rerun on a folder must match the settings its records carry."""

    env: str
    short: bool
    split: str  # one split, or several joined by commas
    actor: str  # the policy's name (``PolicySpec.name``: expert:0.30 and expert:0.3 are the same actor)
    seed: int
    max_turns: int | None  # None: the environment's own limit
    temperature: float | None = None  # LM actors only
    max_new_tokens: int | None = None  # LM actors only
    environment: dict[str, Any] | None = None  # the environment's ``describe()``: its data, corpus, retriever, topk, ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, stored: Any) -> list[str]:
        """``name: stored value (now value)`` for every setting the stored copy does not share ([] if all match)."""
        if not isinstance(stored, dict):
            return [f"{SETTINGS_KEY}: {stored!r}"]
        stored = {**stored, "actor": resolved_actor(stored.get("actor"))}
        return [line for name, value in self.to_json().items() for line in _differences(name, stored.get(name), value)]


def _differences(name: str, stored: Any, now: Any) -> list[str]:
    """``name stored (now value)`` where they differ, key by key inside objects (``environment.options.topk 1 (now
    5)``)."""
    if stored == now:
        return []
    if isinstance(stored, dict) and isinstance(now, dict):
        return [line for key in sorted(set(stored) | set(now), key=str)
                for line in _differences(f"{name}.{key}", stored.get(key), now.get(key))]  # fmt: skip
    return [f"{name} {stored!r} (now {now!r})"]


def resolved_actor(name: Any) -> Any:
    """An actor's name with a local model path resolved (``PolicySpec.resolved``), so that records written when the
    path was spelled otherwise (``DIR/``, relative) still match; any other value as it is."""
    if not isinstance(name, str):
        return name
    try:
        return parse_policy(name, trials=True).resolved().name
    except ValueError:
        return name


def select_tasks(tasks: Sequence[Task], episodes: int | None, seed: int) -> list[Task]:
    """The first ``episodes`` tasks (all when None) of the split shuffled with ``seed``: a smaller count is a prefix
    of a larger one. More episodes than tasks raises ``ValueError`` (each task is evaluated once)."""
    order = list(tasks)
    repeated = [task_id for task_id, count in Counter(task.id for task in order).items() if count > 1]
    if repeated:
        raise ValueError(f"the splits list task {repeated[0]!r} more than once (each task is played once)")
    random.Random(seed).shuffle(order)
    if episodes is None:
        return order
    check_episodes(episodes, order)
    return order[:episodes]


def episode_seed(seed: int, task_id: str) -> int:
    """A stable 63-bit seed of one episode (the same across runs and processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{task_id}".encode()).digest()[:8], "big") >> 1


class PerEpisodePolicy:
    """Wraps a cheap stateful policy (expert:EPS, random): one instance per episode, seeded by ``episode_seed``, so
    what an episode does depends on its task and the seed only, not on which episodes share its batch."""

    def __init__(self, build: Callable[[int], Policy], seed: int, name: str):
        self.build = build
        self.seed = seed
        self.name = name
        self._policies: dict[int, Policy] = {}

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        actions = []
        for episode in episodes:
            policy = self._policies.get(id(episode))
            if policy is None:
                policy = self._policies[id(episode)] = self.build(episode_seed(self.seed, episode.task.id))
            actions += policy.act([episode])
        return actions

    def forget(self) -> None:
        self._policies.clear()


@dataclass(frozen=True)
class Outcome:
    """What the results read of one episode's record."""

    task: str
    success: bool
    steps: int
    trials: int = 1  # Reflexion: the trials the task took
    failed_steps: int = 0  # steps the environment could not carry out (Step.error)

    @classmethod
    def of(cls, trajectory: Trajectory) -> Outcome:
        from deltattg.rollout.reflexion import trials_used

        return cls(trajectory.group, trajectory.success, trajectory.num_steps, trials_used(trajectory),
                   failed_steps(trajectory))


@dataclass
class Finished:
    """What ``episodes.jsonl`` already holds: each record's outcome (file order) and the task ids they cover."""

    outcomes: list[Outcome] = field(default_factory=list)
    task_ids: set[str] = field(default_factory=set)


def read_finished(path: Path, settings: EvalSettings, selected: dict[str, Task]) -> Finished:
    """The outcomes of an earlier run's records in ``path`` (none if the file does not exist). Each must be a valid
    trajectory record of this run: the same settings, a task among ``selected``, no task twice; anything else raises
    ``InputError`` naming the file and line."""
    finished = Finished()
    if not path.exists():
        return finished
    first_line: dict[str, int] = {}
    for line, record in read_jsonl(path):
        try:
            trajectory = parse_trajectory(record)
        except InputError as exc:
            raise exc.located(path=str(path), line=line) from None
        if SETTINGS_KEY not in record:
            raise InputError(f"not a record of `deltattg evaluate` (it has no \"{SETTINGS_KEY}\" settings): use "
                             "another --out", path=str(path), line=line)  # fmt: skip
        differ = settings.differences(record[SETTINGS_KEY])
        if differ:
            raise InputError(f"this folder holds a run with other settings: {'; '.join(differ)}. Rerun with that "
                             "run's settings to resume it, or use another --out",
                             path=str(path), line=line)  # fmt: skip
        task = trajectory.group
        if task not in selected:
            raise InputError(f"task {task!r} is not among this run's {len(selected)} tasks (was the run started with "
                             "a larger --episodes?)", path=str(path), line=line)  # fmt: skip
        if task in first_line:
            raise InputError(f"task {task!r} already has a record (line {first_line[task]})", path=str(path), line=line)
        first_line[task] = line
        finished.outcomes.append(Outcome.of(trajectory))
        finished.task_ids.add(task)
    return finished


class Appender:
    """Appends one JSONL record at a time to a file, each with one ``write`` call, so it is on disk (in the page
    cache) as soon as it returns; a record is never split by a kill between records."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        size = os.fstat(self.fd).st_size
        if size:
            with open(path, "rb") as handle:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":  # a last record without its line break: give it one
                    self._write(b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def append(self, record: dict) -> None:
        self._write((dumps(record) + "\n").encode("utf-8"))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def play(make_env: Callable[[], Environment], tasks: Sequence[Task], policy: Policy, *, max_turns: int | None,
         run: str, on_finish: Callable[[Trajectory], None], trials: bool = False) -> None:  # fmt: skip
    """One episode of each task, played together by ``rollout.engine.run_episodes`` (one batched actor call per
    turn; an episode ends at done or after ``max_turns`` actions, default the environment's limit), handing each
    trajectory to ``on_finish`` the turn it ends. ``trials``: up to 3 Reflexion trials per task
    (``rollout.reflexion.run_reflexion``; ``policy`` must also ``reflect``), each task's last one handed on."""
    if trials:
        from deltattg.rollout.reflexion import run_reflexion

        run_reflexion(make_env, tasks, policy, max_turns=max_turns, run=run, on_finish=on_finish)  # type: ignore[arg-type]
        return
    run_episodes(make_env, tasks, policy, max_turns=max_turns, run=run, on_finish=on_finish)


def evaluation_record(trajectory: Trajectory, settings: EvalSettings) -> dict:
    """``collect``'s record (prompt ids dropped: rebuilt from the messages when needed) plus the run's settings."""
    for step in trajectory.steps or []:
        step.prompt_ids = None
    return {**trajectory.to_json(), SETTINGS_KEY: settings.to_json()}


def run_evaluation(
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    make_policy: Callable[[], Policy],
    spec: PolicySpec,
    settings: EvalSettings,
    out: Path,
    *,
    progress: bool = True,
    chunk: int = CHUNK,
    log: Callable[[str], None] = lambda message: None,
) -> dict:
    """Evaluate on ``tasks`` into the folder ``out`` (see the module doc) and return the results (``results.json``).
    The folder is held for the whole run (``rollout.output.held_folder``: a second run on it is refused, as is a
    folder that cannot be created or written), before anything is read or played. ``make_policy`` is called only if
    some task is left to play. Bad or foreign records in ``out/episodes.jsonl`` raise ``InputError`` before anything
    is written."""
    with held_folder(out):
        return _run_held(make_env, tasks, make_policy, spec, settings, out, progress=progress, chunk=chunk, log=log)


def _run_held(make_env: Callable[[], Environment], tasks: Sequence[Task], make_policy: Callable[[], Policy],
              spec: PolicySpec, settings: EvalSettings, out: Path, *, progress: bool, chunk: int,
              log: Callable[[str], None]) -> dict:  # fmt: skip
    """:func:`run_evaluation` in a folder this process holds."""
    import torch
    from tqdm import tqdm

    started = time.perf_counter()
    path = out / EPISODES_FILE
    selected = {task.id: task for task in tasks}  # ids are unique (select_tasks)
    finished = read_finished(path, settings, selected)
    todo = [task for task in tasks if task.id not in finished.task_ids]
    if finished.outcomes:
        log(f"resuming: {len(finished.outcomes)} of {len(tasks)} episodes already in {path}; playing {len(todo)}")
    outcomes = list(finished.outcomes)
    if todo:
        policy = make_policy()
        bar = tqdm(total=len(tasks), initial=len(outcomes), desc=f"evaluate {spec.name}", unit="ep",
                   disable=not progress)  # fmt: skip
        with Appender(path) as appender:

            def keep(trajectory: Trajectory) -> None:
                appender.append(evaluation_record(trajectory, settings))
                outcomes.append(Outcome.of(trajectory))
                bar.update(1)

            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                if spec.is_model:
                    torch.manual_seed(episode_seed(settings.seed, part[0].id))
                play(make_env, part, policy, max_turns=settings.max_turns, run=f"{spec.name}/", on_finish=keep,
                     trials=spec.kind == "reflexion")  # fmt: skip
                if isinstance(policy, PerEpisodePolicy):
                    policy.forget()
        bar.close()
    results = summarize(outcomes, selected, settings)
    results |= {"played": len(todo), "resumed": len(finished.outcomes),
                "wall_seconds": round(time.perf_counter() - started, 3)}  # fmt: skip
    with atomic_output(out / RESULTS_JSON) as handle:
        json.dump(results, handle, indent=2)
        handle.write("\n")
    with atomic_output(out / RESULTS_MD) as handle:
        handle.write(results_markdown(results))
    return results


def stats(rows: Sequence[tuple[bool, int]]) -> dict[str, Any]:
    """Episodes, successes, success rate, average steps (all episodes) and average steps of the successful ones."""
    wins = [steps for success, steps in rows if success]
    return {
        "episodes": len(rows),
        "successes": len(wins),
        "success": len(wins) / len(rows) if rows else None,
        "avg_steps": sum(steps for _, steps in rows) / len(rows) if rows else None,
        "avg_steps_success": sum(wins) / len(wins) if wins else None,
    }


def summarize(outcomes: Sequence[Outcome], selected: dict[str, Task], settings: EvalSettings) -> dict:
    """The results of a finished run: overall and per task type (per category on BFCL), the known types first in
    the paper's column order, any others after them."""
    rows: dict[str, list[tuple[bool, int]]] = {}
    everything = []
    for outcome in outcomes:
        row = (outcome.success, outcome.steps)
        rows.setdefault(task_type(settings.env, selected[outcome.task]), []).append(row)
        everything.append(row)
    known = list(COLUMNS.get(settings.env, {}))
    order = known + sorted(set(rows) - set(known))
    results = {
        **settings.to_json(),
        "episodes": len(outcomes),
        "breakdown": breakdown_name(settings.env),
        "overall": stats(everything),
        "by_type": {name: stats(rows.get(name, [])) for name in order},
        "failed_steps": sum(o.failed_steps for o in outcomes),
        "episodes_with_failed_steps": sum(o.failed_steps > 0 for o in outcomes),
        "episodes_file": EPISODES_FILE,
    }
    if settings.actor.startswith("reflexion:"):
        results["trials"] = trial_stats(outcomes)
    return results


def trial_stats(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Reflexion: the most trials any task took, the average taken, and the success rate within k trials."""
    from deltattg.rollout.reflexion import TRIALS

    most = max([TRIALS, *(o.trials for o in outcomes)])
    return {
        "max": most,
        "avg_used": sum(o.trials for o in outcomes) / len(outcomes) if outcomes else None,
        "success_within": [sum(o.success and o.trials <= k for o in outcomes) / len(outcomes) if outcomes else None
                           for k in range(1, most + 1)],
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _trials_line(trials: dict | None) -> str:
    if not trials:
        return ""
    within = ", ".join(f"{_percent(s)} % within {k}" for k, s in enumerate(trials["success_within"], 1))
    used = _number(trials["avg_used"])
    return f" Reflexion: up to {trials['max']} trials per task, {used} used on average; success {within}."


def failed_steps_warning(results: dict) -> str | None:
    """The warning of a run whose environment could not carry out some steps (None when it carried out all)."""
    return service_warning(results["failed_steps"], results["episodes_with_failed_steps"], results["episodes"])


def results_markdown(results: dict) -> str:
    """``results.md``: the paper's Table 7 layout (success % per type as columns), then one row per type."""
    env = results["env"]
    names = COLUMNS.get(env, {})
    kind = results["breakdown"]
    overall = results["overall"]
    types = results["by_type"]
    where = f"{env}{' (short)' if results['short'] else ''} {results['split']}"
    layout = " (the paper's Table 7 layout)" if names is ALFWORLD_COLUMNS else ""
    turns = results["max_turns"] if results["max_turns"] is not None else "the environment's limit"
    sampling = ""
    if results.get("temperature") is not None:
        sampling = f", temperature {results['temperature']:g}, max new tokens {results['max_new_tokens']}"
    lines = [
        f"# deltattg evaluate: {results['actor']} on {where}",
        "",
        f"{results['episodes']} episodes, seed {results['seed']}, max turns: {turns}{sampling}; "
        f"success {_percent(overall['success'])} %, average steps {_number(overall['avg_steps'])} "
        f"({_number(overall['avg_steps_success'])} in successful episodes). "
        f"Wall time {results['wall_seconds']:.2f} s ({results['played']} episodes played, {results['resumed']} "
        "resumed from episodes.jsonl)." + _trials_line(results.get("trials")),
        "",
        f"Success % per {kind}{layout}:",
        "",
        "| actor | " + " | ".join(names.get(t, t) for t in types) + " | All |",
        "|---|" + "---:|" * (len(types) + 1),
        f"| {results['actor']} | " + " | ".join(_percent(s["success"]) for s in types.values())
        + f" | {_percent(overall['success'])} |",
        "",
        f"| {kind} | episodes | success % | avg steps | avg steps (successes) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in [*types.items(), ("all", overall)]:
        label = f"**{name}**" if name == "all" else name
        lines.append(f"| {label} | {s['episodes']} | {_percent(s['success'])} | {_number(s['avg_steps'])} | "
                     f"{_number(s['avg_steps_success'])} |")  # fmt: skip
    if warning := failed_steps_warning(results):
        lines += ["", f"**{warning[0].upper()}{warning[1:]}.**"]
    return "\n".join(lines) + "\n"
