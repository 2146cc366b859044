"""Where the progress meter's labels come from: one :class:`~deltattg.data.labels.StateLabel` per decision state of a
pool, from one of four sources (``deltattg labels --labels SOURCE``, ``train-meter --labels SOURCE``):

* ``outcome``   — the paper's (Eq. 1–2): every state gets its own trajectory's outcome and remaining tokens;
* ``rollout``   — K completions from the replayed state by a completer policy: b̃ = their success rate (a soft
  target), v = the mean remaining tokens of the successful ones;
* ``best-of-k`` — the same completions and the record's own continuation: b = any of them succeeded, v = the fewest
  remaining tokens among the successful ones (what a planner reads, estimated from policies);
* ``td``        — bootstrapped from a meter's own readings of the record's states, no resets (TD(λ)).

The terminal state is always anchored to the outcome. A state the environment does not reproduce (``envs.replay``)
keeps its outcome label and says so (``source: "outcome"``, ``replayed: false``), counted in the report; a pool none
of whose states replays (another environment than it was played in) is refused.

Labels are computed once and kept in a JSONL file. While a run works, the file is ``FILE.partial``, appended chunk by
chunk (:data:`CHUNK` trajectories, in the input's task order), and renamed to ``FILE`` when every trajectory is
labelled; a killed run leaves the ``.partial`` file, which the same command resumes. Each chunk draws its completions
from its own random stream (seeded by the label seed and its first trajectory), so a resumed run redoes the chunk it
was killed in and gives exactly the labels of an uninterrupted one. Every record carries the settings that shaped it
and its trajectory's digest (``data.labels.trajectory_digest``): a file of other settings is refused; labels of a
trajectory whose content changed (a pool collected again under the same ids) are refused in a file and made again
in a cache. One process at a time writes a label file (a lock beside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import atomic_output, dumps, iter_jsonl
from deltattg.data.labels import (
    DIGEST_KEY,
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
    trajectory_digest,
)
from deltattg.data.sources import Located
from deltattg.data.trajectory import Trajectory
from deltattg.errors import InputError
from deltattg.rollout.completions import CompletionCost, complete_states
from deltattg.rollout.engine import Policy
from deltattg.rollout.output import held_file
from deltattg.envs.replay import recorded_episode

# ---- the label file: appended chunk by chunk, resumable -------------------------------------------------------------
LABELS_FOLDER_SUFFIX = ".labels"  # train-meter keeps a pool's labels in POOL.labels/, one file per setting
PARTIAL_SUFFIX = ".partial"  # the label file while a run is still writing it
CHUNK = 32  # trajectories labelled together: one batch of completions, one random stream, one append


def label_cache_path(pool: str | os.PathLike, settings: LabelSettings) -> Path:
    """Where ``train-meter`` keeps a pool's labels of ``settings``: ``POOL.labels/SOURCE-HASH.jsonl`` beside the pool
    file, the hash over every setting that shapes a label (``LabelSettings.to_json``), so labels made otherwise are
    never mixed in."""
    text = json.dumps(settings.to_json(), sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    pool = Path(pool)
    return pool.with_name(pool.name + LABELS_FOLDER_SUFFIX) / f"{settings.source}-{digest}.jsonl"


def partial_path(path: str | os.PathLike) -> Path:
    """Where a run writes the label file ``path`` until every trajectory is labelled."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


@dataclass
class StoredLabels:
    """What a label file holds for the trajectories asked for: the records of the complete ones by id, those of
    other trajectories (a cache shared by subsets of a pool), and how many trajectories' records were made from other
    content (dropped, to be labelled again)."""

    done: dict[str, list[dict]] = field(default_factory=dict)
    others: list[dict] = field(default_factory=list)
    stale: int = 0

    @property
    def records(self) -> int:
        return len(self.others) + sum(map(len, self.done.values()))


def read_label_file(path: Path, settings: LabelSettings, wanted: dict[str, tuple[Trajectory, str]],
                    cache: bool = False) -> StoredLabels:
    """The label records an earlier run left for the trajectories ``wanted`` (id → (trajectory, its digest)): from
    the ``.partial`` file where a run left one, else from ``path`` (nothing when neither exists). Records of other
    settings, or of a trajectory not in ``wanted``, raise ``InputError`` naming the file and line — unless ``cache``,
    where other trajectories' records are kept as they are, and labels made from other content than the trajectory's
    now (another digest) are dropped and counted (a plain label file refuses them: its input changed). A trajectory
    with states missing (a run killed while writing it) is left out, to be labelled again."""
    stored = StoredLabels()
    source = partial_path(path) if partial_path(path).exists() else path
    if not source.exists():
        return stored
    expected = settings.to_json()
    found: dict[str, list[dict]] = {}
    stale: set[str] = set()
    for line, record in _complete_lines(source):
        if record.get(SETTINGS_KEY) != expected:
            raise InputError(f"holds labels made with other settings ({json.dumps(record.get(SETTINGS_KEY))}, now "
                             f"{json.dumps(expected)}): rerun with those settings to resume, or write elsewhere",
                             path=str(source), line=line)  # fmt: skip
        key = record.get("id")
        if key not in wanted:
            if cache:
                stored.others.append(record)
                continue
            raise InputError(f"a label of trajectory {key!r}, which is not in the input", path=str(source), line=line)
        trajectory, digest = wanted[key]
        if record.get(DIGEST_KEY) != digest:
            if cache:
                stale.add(key)
                continue
            raise InputError(f"holds labels of trajectory {key!r} made from other content than the input's (its "
                             "messages, step tokens or outcome changed: the pool was collected again or edited); "
                             "write the labels elsewhere, or delete this file to label afresh", path=str(source),
                             line=line)  # fmt: skip
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= trajectory.num_steps:
            raise InputError(f"step must be a state of the trajectory, got {step!r}", path=str(source), line=line,
                             field="step")  # fmt: skip
        found.setdefault(key, []).append(record)
    stored.stale = len(stale)
    stored.done = {key: records for key, records in found.items()
                   if key not in stale and set(range(wanted[key][0].num_steps)) <= {r["step"] for r in records}}
    return stored


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


def _write(path: Path, records: Sequence[dict]) -> None:
    """``records`` as the whole of ``path``, atomically."""
    with atomic_output(path) as handle:
        for record in records:
            handle.write(dumps(record) + "\n")


def file_source(path: str | os.PathLike) -> str | None:
    """The label source of an existing label file (of its finished or its ``.partial`` form; the first record's
    ``labelling.source``, ``outcome`` for records that carry no settings: ``deltattg labels``' outcome labels), or
    None when there is none or it is empty."""
    for candidate in (partial_path(path), Path(path)):
        if not candidate.is_file():
            continue
        for _, record in iter_jsonl(candidate):
            if isinstance(record, InputError):
                return None
            settings = record.get(SETTINGS_KEY)
            return str(settings.get("source")) if isinstance(settings, dict) else "outcome"
    return None


@dataclass
class LabelReport:
    """What labelling a pool did: trajectories and states labelled (and already there; made from other content
    and labelled again), states that kept their outcome label because they did not replay, and the completion
    cost."""

    trajectories: int = 0
    reused: int = 0
    stale: int = 0
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
        if self.stale:
            text += (f"; {self.stale} trajectories' stored labels were made from other content (the pool was "
                     "collected again) and were made again")
        if self.cost is not None:
            c = self.cost
            text += (f"; {c.episodes} completions, {c.env_steps} environment steps, {c.completer_tokens} completer "
                     f"tokens, {c.seconds:.1f} s")
            share = c.unreplayable / c.states if c.states else 0.0
            text += f"; {c.unreplayable} of {c.states} completed states ({share:.1%}) did not replay"
            if c.unreplayable:
                why = ", ".join(f"{n}: {reason}" for reason, n in c.mismatches.items())
                text += f" and keep their outcome label ({why})"
        for source, (states, completable) in self.completable.items():
            text += f"\n  {source}: {states} states, {completable / max(states, 1):.1%} labelled completable"
        return text


def chunk_seed(seed: int, first: str) -> int:
    """The seed of the random stream a chunk of trajectories is completed with: the label seed and the chunk's first
    trajectory id (stable across runs and processes)."""
    from deltattg.rollout.evaluate import episode_seed

    return episode_seed(seed, first)


def start_stream(policy: Policy, seed: int) -> None:
    """Draw ``policy``'s next samples from a stream of its own seeded by ``seed``: torch's (an LM samples with it)
    and the policy's own generator where it keeps one (``random``, ``expert:EPS``)."""
    import torch

    torch.manual_seed(seed)
    if isinstance(getattr(policy, "rng", None), random.Random):
        policy.rng = random.Random(seed)  # type: ignore[attr-defined]


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
    cache: bool = False,
    chunk: int = CHUNK,
    progress: bool = True,
) -> tuple[dict[str, list[StateLabel]], LabelReport]:
    """The labels of every trajectory of ``items`` (s_0..s_T each, by trajectory id), kept in the label file ``path``
    (resumed where an earlier run left it, see the module doc). ``completer`` builds the completion policy (replay
    sources; called only if some trajectory is left to label), ``count_action`` counts an action's tokens where the
    completer records none, ``bootstrap`` reads a meter's (p̂, v̂) of every state s_0..s_T of trajectories (``td``);
    ``make_env`` replaces the environment each record describes and ``max_turns`` is the turn limit of records
    without one (``rollout.replay.recorded_episode``); ``cache``: the file is a cache shared by subsets of a pool
    (other trajectories' labels are kept, labels made from other content are made again; see
    :func:`read_label_file`). A record that cannot be replayed at all (no provenance) is refused with its file and
    line, and so is a pool none of whose states replays."""
    path = Path(path)
    with held_file(path):
        return _make_labels(items, step_tokens, settings, path, completer=completer, count_action=count_action,
                            bootstrap=bootstrap, make_env=make_env, max_turns=max_turns, cache=cache, chunk=chunk,
                            progress=progress)  # fmt: skip


def _make_labels(items: Sequence[Located], step_tokens: Sequence[Sequence[int]], settings: LabelSettings, path: Path,
                 *, completer: Callable[[], Policy] | None, count_action: Callable[[str], int] | None,
                 bootstrap: Callable | None, make_env: Callable[[], Any] | None, max_turns: int | None, cache: bool,
                 chunk: int, progress: bool) -> tuple[dict[str, list[StateLabel]], LabelReport]:
    """:func:`make_labels` while this process holds the label file."""
    from tqdm import tqdm

    by_id = {item.trajectory.id: item.trajectory for item in items}
    tokens_of = {item.trajectory.id: list(tokens) for item, tokens in zip(items, step_tokens)}
    digests = {key: trajectory_digest(trajectory, tokens_of[key]) for key, trajectory in by_id.items()}
    stored = read_label_file(path, settings, {key: (by_id[key], digests[key]) for key in by_id}, cache)
    # the input's trajectories, a task's together (the states they share, their first at least, are completed once),
    # in fixed chunks: a chunk with a trajectory left to label is labelled whole, from its own random stream
    ordered = sorted(items, key=lambda item: item.trajectory.group)
    chunks = [ordered[start : start + chunk] for start in range(0, len(ordered), chunk)]
    todo = [part for part in chunks if any(item.trajectory.id not in stored.done for item in part)]
    redo = {item.trajectory.id for part in todo for item in part}
    done = {key: records for key, records in stored.done.items() if key not in redo}
    report = LabelReport(trajectories=len(items), reused=len(done), stale=stored.stale)
    recorded = {}
    if settings.source in REPLAYED_SOURCES:
        for part in todo:  # every record is checked before any completion is played
            for item in part:
                try:
                    recorded[item.trajectory.id] = recorded_episode(item.trajectory, make_env, max_turns)
                except InputError as exc:
                    raise exc.located(path=item.path, line=item.line) from None
    labels: dict[str, list[StateLabel]] = {key: labels_of_records(records, by_id[key]) for key, records in done.items()}
    if todo:
        policy = completer() if settings.source in REPLAYED_SOURCES and completer is not None else None
        if settings.source in REPLAYED_SOURCES:
            report.cost = CompletionCost()
        work = partial_path(path)
        created = not work.exists()
        _write(work, [*stored.others, *(r for records in done.values() for r in records)])  # what is kept, alone
        appended = False
        try:
            with open(work, "a", encoding="utf-8") as handle, \
                    tqdm(total=len(redo), desc=f"labels ({settings.source})", unit="traj", disable=not progress) as bar:
                for part in todo:
                    batch = [item.trajectory for item in part]
                    if policy is not None:
                        start_stream(policy, chunk_seed(settings.seed, batch[0].id))
                    made, found = _label_batch(batch, [tokens_of[t.id] for t in batch], settings, recorded, policy,
                                               count_action, bootstrap, report)  # fmt: skip
                    check_some_replayed(report, part[0])
                    lines = []
                    for trajectory, state_labels, completions in zip(batch, made, found):
                        labels[trajectory.id] = state_labels
                        lines += [dumps(r) for r in label_records(trajectory, state_labels, settings, completions,
                                                                  digest=digests[trajectory.id])]  # fmt: skip
                    handle.write("".join(line + "\n" for line in lines))  # one chunk, then flushed
                    handle.flush()
                    appended = True
                    bar.update(len(batch))
        except BaseException:
            if created and not appended:  # nothing of this run's in it: no trace (the kept records are at path)
                work.unlink(missing_ok=True)
            raise
        finished = read_label_file(path, settings, {key: (by_id[key], digests[key]) for key in by_id}, cache)
        _write(path, [*finished.others, *(r for key in by_id for r in finished.done[key])])  # the input's order
        work.unlink()
    elif partial_path(path).exists():  # a run killed after its last chunk, before the rename
        _write(path, [*stored.others, *(r for key in by_id for r in done[key])])
        partial_path(path).unlink()
    report.states = sum(t.num_steps for t in by_id.values())
    report.unreplayable = report.cost.unreplayable if report.cost is not None else 0
    report.completable = completable_by_source(labels)
    return labels, report


def labels_of_batch(trajectories: Sequence[Trajectory], settings: LabelSettings, policy: Policy,
                    count_action: Callable[[str], int], make_env: Callable[[], Any] | None = None,
                    max_turns: int | None = None) -> tuple[dict[str, list[StateLabel]], CompletionCost]:
    """Labels of a replayed source (``rollout`` / ``best-of-k``) for trajectories held in memory, by id, and what
    their completions cost; nothing is written. The on-policy meter refresh labels an RL batch with it, the current
    actor completing. Each trajectory is replayed in ``make_env``'s environment (else the one its record names); a
    state that does not replay keeps its outcome label (counted in the cost)."""
    if settings.source not in REPLAYED_SOURCES:
        raise ValueError(f"labels of a batch come from completions ({', '.join(REPLAYED_SOURCES)}), not "
                         f"{settings.source!r}")
    if len({t.id for t in trajectories}) != len(trajectories):
        raise ValueError("labels of a batch are kept by trajectory id: the batch repeats an id")
    if any(t.step_tokens is None for t in trajectories):
        raise ValueError(f"{next(t.id for t in trajectories if t.step_tokens is None)}: labels count each step's "
                         "tokens, and this trajectory has no step_tokens")
    report = LabelReport(trajectories=len(trajectories), cost=CompletionCost())
    recorded = {t.id: recorded_episode(t, make_env, max_turns) for t in trajectories}
    labels, _ = _label_batch(trajectories, [t.step_tokens or [] for t in trajectories], settings, recorded, policy,
                             count_action, None, report)  # fmt: skip
    assert report.cost is not None
    return {t.id: state_labels for t, state_labels in zip(trajectories, labels)}, report.cost


def check_some_replayed(report: LabelReport, first: Located) -> None:
    """Refuse (``InputError`` naming the pool) a run in which not one completed state has replayed so far: the
    records were played in another environment than the one rebuilt (a ``--short`` pool read without ``--short``,
    another ``--env``), and every label would be the outcome's under a replay source's name."""
    cost = report.cost
    if cost is None or not cost.states or cost.unreplayable < cost.states:
        return
    why = ", ".join(f"{n}: {reason}" for reason, n in cost.mismatches.items()) or "none reproduced"
    raise InputError(f"not one of {cost.states} states replayed ({why}): these records were not played in the "
                     "environment rebuilt for them (check --env and its options, e.g. --short); nothing written",
                     path=first.path)  # fmt: skip


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
