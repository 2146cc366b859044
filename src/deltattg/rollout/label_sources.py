"""Where the progress meter's labels come from: one :class:`~deltattg.data.labels.StateLabel` per decision state of a
pool, from one of four sources (``deltattg labels --labels SOURCE``, ``train-meter --labels SOURCE``):

* ``outcome``   — the paper's (Eq. 1–2): every state gets its own trajectory's outcome and remaining tokens;
* ``rollout``   — K completions from the replayed state by a completer policy: b̃ = their success rate (a soft
  target), v = the mean remaining tokens of the successful ones;
* ``best-of-k`` — the same completions and the record's own continuation: b = any of them succeeded, v = the fewest
  remaining tokens among the successful ones (what a planner reads, estimated from policies);
* ``td``        — bootstrapped from a meter's own readings of the record's states, no resets (TD(λ)).

The terminal state is always anchored to the outcome. A state the environment does not reproduce (``envs.replay``)
keeps its outcome label and says so (``source: "outcome"``, ``replayed: false``), counted in the report.

Labels are computed once and kept in a JSONL file, appended trajectory by trajectory as they are done, so a killed
run keeps what it finished and the same command resumes it (a file holding labels of other settings is refused).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import atomic_output, dumps, iter_jsonl
from deltattg.data.labels import (
    REPLAYED_SOURCES,
    SETTINGS_KEY,
    LabelSettings,
    StateLabel,
    completion_rounds,
    label_records,
    labels_of_records,
    outcome_labels,
    replayed_labels,
    td_labels,
)
from deltattg.data.sources import Located
from deltattg.data.trajectory import Trajectory
from deltattg.errors import InputError
from deltattg.rollout.completions import CompletionCost, complete_states
from deltattg.rollout.engine import Policy
from deltattg.envs.replay import recorded_episode

# ---- the label file: appended trajectory by trajectory, resumable ------------------------------------------------------
LABELS_FOLDER_SUFFIX = ".labels"  # train-meter keeps a pool's labels in POOL.labels/, one file per setting
COMMAND_LINE_SETTINGS = ("env", "short", "env_data", "corpus", "retriever", "topk", "max_turns", "tokenizer",
                         "completer_temperature", "completer_max_new_tokens")  # fmt: skip


def label_cache_path(pool: str | os.PathLike, settings: LabelSettings, environment: dict[str, Any]) -> Path:
    """Where ``train-meter`` keeps a pool's labels of ``settings``: ``POOL.labels/SOURCE-HASH.jsonl`` beside the pool
    file, the hash over the settings and the command line's environment, turn limit, tokenizer and completer sampling
    (the :data:`COMMAND_LINE_SETTINGS` of ``environment``), so labels made otherwise are never mixed in."""
    import hashlib

    shaping = {"labels": settings.to_json(), **{k: environment.get(k) for k in COMMAND_LINE_SETTINGS}}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:12]
    pool = Path(pool)
    return pool.with_name(pool.name + LABELS_FOLDER_SUFFIX) / f"{settings.source}-{digest}.jsonl"


def read_label_file(path: Path, settings: LabelSettings, wanted: dict[str, Trajectory],
                    keep_others: bool = False) -> tuple[dict[str, list[dict]], list[dict]]:
    """The complete trajectories' records of an earlier run in ``path`` (none when it does not exist), by trajectory
    id. Records of other settings, or of a trajectory not in ``wanted`` (unless ``keep_others``: a cache shared by
    subsets of a pool, whose other trajectories are kept as they are), raise ``InputError`` naming the file and
    line; a trajectory with states missing (a run killed while writing it) is left out, to be labelled again.
    Returns the complete trajectories' records by id and the others' records."""
    found: dict[str, list[dict]] = {}
    others: list[dict] = []
    if not path.exists():
        return found, others
    expected = settings.to_json()
    for line, record in _complete_lines(path):
        if record.get(SETTINGS_KEY) != expected:
            raise InputError(f"holds labels made with other settings ({json.dumps(record.get(SETTINGS_KEY))}, now "
                             f"{json.dumps(expected)}): rerun with those settings to resume, or write elsewhere",
                             path=str(path), line=line)  # fmt: skip
        if record.get("id") not in wanted:
            if keep_others:
                others.append(record)
                continue
            raise InputError(f"a label of trajectory {record.get('id')!r}, which is not in the input", path=str(path),
                             line=line)  # fmt: skip
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= wanted[record["id"]].num_steps:
            raise InputError(f"step must be a state of the trajectory, got {step!r}", path=str(path), line=line,
                             field="step")  # fmt: skip
        found.setdefault(record["id"], []).append(record)
    complete = {key: records for key, records in found.items()
                if set(range(wanted[key].num_steps)) <= {r["step"] for r in records}}  # fmt: skip
    return complete, others


def _complete_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line, record)`` of a label file; a last line cut short by a killed run (no line break, not JSON) is
    dropped, any other malformed line raises ``InputError`` naming it."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        handle.seek(max(size - 1, 0))
        torn = size > 0 and handle.read(1) != b"\n"
    lines = list(iter_jsonl(path))
    for k, (line, record) in enumerate(lines):
        if isinstance(record, InputError):
            if torn and k == len(lines) - 1:
                return
            raise record
        yield line, record


def _ends_with(path: Path, records: int) -> bool:
    """Whether the label file holds exactly ``records`` lines, the last one ended by a line break (nothing to drop
    before appending)."""
    data = path.read_bytes()
    return data.endswith(b"\n") and data.count(b"\n") == records or not data


def _rewrite(path: Path, kept: dict[str, list[dict]], others: Sequence[dict]) -> None:
    """Replace ``path`` with only the complete trajectories' records and ``others`` (atomically)."""
    with atomic_output(path) as handle:
        for record in [*others, *(r for records in kept.values() for r in records)]:
            handle.write(dumps(record) + "\n")


@dataclass
class LabelReport:
    """What labelling a pool did: trajectories and states labelled (and already there), states that kept their outcome
    label because they did not replay, and the completion cost."""

    trajectories: int = 0
    reused: int = 0
    states: int = 0
    unreplayable: int = 0
    cost: CompletionCost | None = None
    completable: dict[str, list[int]] = field(default_factory=dict)  # source -> [states, labelled completable]

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "cost"}
        if self.cost is not None:
            out["cost"] = self.cost.as_dict()
        return out

    def summary(self) -> str:
        text = f"{self.states} decision states of {self.trajectories} trajectories"
        if self.reused:
            text += f" ({self.reused} trajectories' labels already there)"
        if self.cost is not None:
            c = self.cost
            text += (f"; {c.episodes} completions, {c.env_steps} environment steps, {c.completer_tokens} completer "
                     f"tokens, {c.seconds:.1f} s")
            if c.unreplayable:
                why = ", ".join(f"{n}: {reason}" for reason, n in c.mismatches.items())
                text += f"; {c.unreplayable} states did not replay and keep their outcome label ({why})"
        for source, (states, completable) in self.completable.items():
            text += f"\n  {source}: {states} states, {completable / max(states, 1):.1%} labelled completable"
        return text


def make_labels(
    items: Sequence[Located],
    step_tokens: Sequence[Sequence[int]],
    settings: LabelSettings,
    path: str | os.PathLike,
    *,
    completer: Callable[[], Policy] | None = None,
    count_action: Callable[[str], int] | None = None,
    bootstrap: Callable[[Sequence[Trajectory]], list[list[tuple[float, float | None] | None]]] | None = None,
    make_env: Callable[[], Any] | None = None,
    max_turns: int | None = None,
    keep_others: bool = False,
    chunk: int = 32,
    progress: bool = True,
) -> tuple[dict[str, list[StateLabel]], LabelReport]:
    """The labels of every trajectory of ``items`` (s_0..s_T each, by trajectory id), kept in the label file ``path``
    (resumed where an earlier run left it, see the module doc). ``completer`` builds the completion policy (replay
    sources; called only if some trajectory is left to label), ``count_action`` counts an action's tokens where the
    completer records none, ``bootstrap`` reads a meter's (p̂, v̂) of every state s_0..s_T of trajectories (``td``);
    ``make_env`` replaces the environment each record describes and ``max_turns`` is the turn limit of records
    without one (``rollout.replay.recorded_episode``); ``keep_others`` keeps the labels of other trajectories in the
    file (a cache shared by subsets of a pool) instead of refusing them.
    A record that cannot be replayed at all (no provenance) is refused with its file and line."""
    from tqdm import tqdm

    path = Path(path)
    by_id = {item.trajectory.id: item.trajectory for item in items}
    tokens_of = {item.trajectory.id: list(tokens) for item, tokens in zip(items, step_tokens)}
    done, others = read_label_file(path, settings, by_id, keep_others)
    if path.exists() and not _ends_with(path, len(others) + sum(map(len, done.values()))):
        _rewrite(path, done, others)  # a killed run's partial trajectory, or a torn last line: dropped
    report = LabelReport(trajectories=len(items), reused=len(done))
    # a task's trajectories together: the states they share (their first, at least) are completed once
    todo = sorted((item for item in items if item.trajectory.id not in done), key=lambda item: item.trajectory.group)
    recorded = {}
    if settings.source in REPLAYED_SOURCES:
        for item in todo:  # every record is checked before any completion is played
            try:
                recorded[item.trajectory.id] = recorded_episode(item.trajectory, make_env, max_turns)
            except InputError as exc:
                raise exc.located(path=item.path, line=item.line) from None
    policy = completer() if todo and settings.source in REPLAYED_SOURCES and completer is not None else None
    if todo and settings.source in REPLAYED_SOURCES:
        report.cost = CompletionCost()
    labels: dict[str, list[StateLabel]] = {key: labels_of_records(records, by_id[key]) for key, records in done.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle, \
            tqdm(total=len(todo), desc=f"labels ({settings.source})", unit="traj", disable=not progress) as bar:
        for start in range(0, len(todo), chunk):
            batch = [item.trajectory for item in todo[start : start + chunk]]
            made, found = _label_batch(batch, [tokens_of[t.id] for t in batch], settings, recorded, policy,
                                       count_action, bootstrap, report)  # fmt: skip
            lines = []
            for trajectory, state_labels, completions in zip(batch, made, found):
                labels[trajectory.id] = state_labels
                lines += [dumps(r) for r in label_records(trajectory, state_labels, settings, completions)]
            handle.write("".join(line + "\n" for line in lines))  # one trajectory batch, then flushed
            handle.flush()
            bar.update(len(batch))
    if todo:  # in the input's order again (they were labelled task by task)
        done, others = read_label_file(path, settings, by_id, keep_others)
        _rewrite(path, {key: done[key] for key in by_id}, others)
    report.states = sum(t.num_steps for t in by_id.values())
    report.unreplayable = report.cost.unreplayable if report.cost is not None else 0
    report.completable = completable_by_source(labels)
    return labels, report


def _label_batch(batch: Sequence[Trajectory], tokens: Sequence[Sequence[int]], settings: LabelSettings,
                 recorded: dict, policy: Policy | None, count_action: Callable[[str], int] | None,
                 bootstrap: Callable | None, report: LabelReport) -> tuple[list[list[StateLabel]], list[list]]:
    """Labels (s_0..s_T) and completions (s_0..s_{T−1}; empty for sources without) of one batch of trajectories."""
    if settings.source == "outcome":
        return [outcome_labels(t, n) for t, n in zip(batch, tokens)], [[] for _ in batch]
    if settings.source == "td":
        assert bootstrap is not None
        readings = bootstrap(batch)
        return [td_labels(t.success, n, r, settings.td_lambda) for t, n, r in zip(batch, tokens, readings)], \
            [[] for _ in batch]  # fmt: skip
    assert policy is not None and count_action is not None and report.cost is not None
    records = [recorded[t.id] for t in batch]
    rounds = completion_rounds(settings.completions) if settings.until_success else [settings.completions]
    found: dict = {}
    pending: set[tuple[int, int]] | None = None  # every state in the first round
    for count in rounds:
        new, cost = complete_states(records, policy, count, count_action, only=pending)
        report.cost.add(cost)
        for state, continuations in new.items():
            found[state] = None if continuations is None else [*(found.get(state) or []), *continuations]
        labels = [replayed_labels(settings.source, t, n, [found[i, s] for s in range(t.num_steps)])
                  for i, (t, n) in enumerate(zip(batch, tokens))]  # fmt: skip
        pending = {(i, s) for i, state_labels in enumerate(labels) for s, label in enumerate(state_labels[:-1])
                   if found[i, s] is not None and not label.can_complete}  # fmt: skip
        if not pending:
            break
    completions = [[found[i, s] for s in range(t.num_steps)] for i, t in enumerate(batch)]
    return labels, completions


def completable_by_source(labels: dict[str, list[StateLabel]]) -> dict[str, list[int]]:
    """Per source that labelled them, the nonterminal states and how many of them are labelled completable."""
    counts: dict[str, list[int]] = {}
    for state_labels in labels.values():
        for label in state_labels[:-1]:
            entry = counts.setdefault(label.source, [0, 0])
            entry[0] += 1
            entry[1] += label.can_complete
    return counts
