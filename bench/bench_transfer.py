"""Cross-domain transfer of progress meters (§5.3): one meter per domain, each read on every domain.

    .venv/bin/python bench/bench_transfer.py --out runs/transfer \\
        [--domains household alfworld bfcl tau2 search awm] [--guide-targets household bfcl search awm]

Per domain (the user's commands, run with this Python's ``deltattg``): ``collect`` a training pool of noisy experts
(``expert:0.1``, ``expert:0.3``, ``expert:0.6``) and a held-out pool (``expert:0.3``, ``expert:0.6``) on tasks of
another split, then ``train-meter`` a regression meter on a frozen SmolLM2-135M with ``--turn-limit none`` (its input
does not state the turns left, so one meter can read any domain's episodes). Then:

* **step quality** (``eval-steps``' measure): every meter reads every held-out pool; a step is judged beneficial when
  the meter's predicted remaining work falls across it (Δ > 0), harmful when it rises, against the labels the noisy
  expert's provenance gives (``collect``: +1 the expert's own action, −1 a deliberate mistake). With
  ``--agentprocessbench DIR`` also AgentProcessBench hotpotqa's human labels (its test split). The meters share one
  frozen backbone and one input format, so each held-out state's backbone features are computed once
  (``features/TARGET.pt``) and every meter's head reads them;
* **guidance** (``guide``): on each ``--guide-targets`` domain's held-out split, ``expert:0.5`` alone, picking at random
  among 4 proposals, and picking by each meter.

Every cell carries its count (labelled steps, episodes) and a 95 % Wilson interval. Every stage is skipped when its
output exists, so an interrupted run resumes; ``--report-only`` runs nothing new and reports what is there (domains
with a meter, guidance cells with a result). ``transfer.md`` / ``transfer.json`` under ``--out``.

Data: ALFWorld's game files from ``--alfworld`` or ``$ALFWORLD_DATA`` (``json_2.1.1`` with ``valid_train`` and
``valid_seen``); search's closed hotpotqa corpus is built from ``--agentprocessbench`` (``hotpotqa.jsonl``); a domain
whose data is not given (ALFWorld, search) is left out, and the report says so; a missing extra stops the study at its
domain's first command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deltattg.summaries import run_deltattg

TRAIN_POLICIES = ("expert:0.1", "expert:0.3", "expert:0.6")
HELDOUT_POLICIES = ("expert:0.3", "expert:0.6")
GUIDE_ACTOR = "expert:0.5"


@dataclass(frozen=True)
class Domain:
    """How to collect one domain: its environment flags, training and held-out splits, turn limit and sizes."""

    name: str
    env: tuple[str, ...]
    train_split: str
    heldout_split: str
    max_turns: int
    train_episodes: int = 12  # per policy
    heldout_episodes: int = 12  # per policy
    group_size: int = 1
    guide_episodes: int = 12
    note: str = ""


def domains(alfworld: str | None, search_data: Path | None) -> dict[str, Domain]:
    """The six domains with their flags; ALFWorld and search only where their data is given."""
    out = {
        "household": Domain("household", ("--env", "household", "--short"), "train", "valid_seen", 12),
        "bfcl": Domain("bfcl", ("--env", "bfcl"), "base", "base", 12,
                       note="held-out tasks drawn from the same split with another seed (a task may repeat)"),
        "tau2": Domain("tau2", ("--env", "tau2"), "retail/train", "retail/test", 12, guide_episodes=10),
        "awm": Domain("awm", ("--env", "awm"), "train", "test", 8, group_size=4, heldout_episodes=12,
                      guide_episodes=3, note="our three-plus-three example scenarios: each task played 4 times"),
    }
    if alfworld:
        out["alfworld"] = Domain("alfworld", ("--env", "alfworld", "--data", alfworld), "valid_train", "valid_seen", 15,
                                 heldout_episodes=8, guide_episodes=8)
    if search_data is not None:
        out["search"] = Domain("search", ("--env", "search", "--data", str(search_data / "questions"), "--corpus",
                                          str(search_data / "corpus.jsonl")), "train", "test", 6, group_size=2,
                               guide_episodes=7, note="7 held-out questions, each played twice per policy")
    return out


def pools(domain: Domain, out: Path, log: Path) -> tuple[Path, Path]:
    """The domain's training and held-out pools (collected unless present)."""
    folder = out / domain.name
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for kind, split, policies, episodes, seed in (
        ("train", domain.train_split, TRAIN_POLICIES, domain.train_episodes, 11),
        ("heldout", domain.heldout_split, HELDOUT_POLICIES, domain.heldout_episodes, 12),
    ):
        path = folder / f"{kind}.jsonl"
        if not path.exists():
            argv = ["collect", *domain.env, "--split", split, *[a for p in policies for a in ("--policy", p)],
                    "--episodes", str(episodes), "--group-size", str(domain.group_size), "--max-turns",
                    str(domain.max_turns), "--tokenizer", "smollm2", "--seed", str(seed), "--out", str(path),
                    "--no-progress"]  # fmt: skip
            run_deltattg(argv, log)
        made.append(path)
    return made[0], made[1]


def meter(domain: Domain, train: Path, out: Path, log: Path, max_length: int) -> Path:
    """The domain's regression meter (trained unless present)."""
    folder = out / domain.name / "meter"
    if not (folder / "meter_config.json").exists():
        run_deltattg(["train-meter", str(train), "--out", str(folder), "--kind", "regression", "--model", "smollm2",
             "--max-length", str(max_length), "--max-message-chars", "1500", "--turn-limit", "none", "--seed", "0"],
            log)  # fmt: skip
    return folder


def wilson(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (scipy's)."""
    if n == 0:
        return float("nan"), float("nan")
    from scipy.stats import binomtest

    ci = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def load_meters(folders: dict[str, Path]):
    """The meters, sharing ONE backbone: they must agree on everything that shapes a state's features."""
    from deltattg.data.pt_files import safe_load
    from deltattg.meter.regression import HEAD_NAME, RegressionConfig, RegressionMeter
    from deltattg.meter.features import feature_settings

    names = list(folders)
    first = RegressionMeter.from_pretrained(folders[names[0]])
    meters = {names[0]: first}
    for name in names[1:]:
        config = RegressionConfig(**json.loads((folders[name] / "meter_config.json").read_text()))
        other = RegressionMeter(first.backbone, first.tokenizer, config)
        other.head.load_state_dict(safe_load(folders[name] / HEAD_NAME))
        shape = ("max_length", "max_message_chars", "turn_limit")
        if feature_settings(other) != feature_settings(first) or any(
            getattr(config, k) != getattr(first.config, k) for k in shape
        ):
            raise SystemExit(f"bench_transfer: meter {folders[name]} reads states differently from {folders[names[0]]}")
        meters[name] = other.eval()
    return meters


def step_quality_cells(meters: dict, target: str, items: Sequence, features_path: Path) -> dict[str, dict]:
    """Every meter's pooled ``eval-steps`` row on ``items`` (located records with ``step_labels``), with its Wilson
    interval. The backbone reads the pool once into ``features_path``; each meter's head reads the shared features."""
    from deltattg.meter.commands import evaluate_steps
    from deltattg.meter.features import cached_features

    reference = next(iter(meters.values()))
    windows = [w for item in items for w in reference.windows(item.trajectory.messages)]
    cached_features(reference, windows, features_path, progress=True)
    cells = {}
    for name, m in meters.items():
        m.feature_cache = features_path
        q = evaluate_steps(items, m, 6144.0, progress=False)["pooled"]["meter (binary)"]
        cells[name] = q.as_dict() | {"accuracy_ci": wilson(q.correct, q.steps), "target": target}
    return cells


def labelled(path: Path, split: Path | None = None, subset: str = "test") -> list:
    """The located records of ``path`` (its ``subset`` of ``split`` when given) that carry ``step_labels``."""
    from deltattg.cli.common import read_records
    from deltattg.meter.commands import select_split

    items = read_records(str(path), False)
    if split is not None:
        items = select_split(items, str(split), subset)
    return [i for i in items if i.trajectory.extra.get("step_labels")]


def guidance(domain: Domain, meter_name: str, meter_folder: Path, out: Path, log: Path) -> dict:
    """``guide`` on the domain's held-out split with one meter (run unless its JSON is present)."""
    path = out / "guide" / f"{domain.name}--{meter_name}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        run_deltattg(["guide", *domain.env, "--split", domain.heldout_split, "--actor", GUIDE_ACTOR, "--candidates", "4",
             "--episodes", str(domain.guide_episodes), "--max-turns", str(domain.max_turns), "--seed", "0",
             "--meter", str(meter_folder), "--json", str(path), "--no-progress"], log)  # fmt: skip
    return json.loads(path.read_text())


def percent(p: float, ci: tuple[float, float]) -> str:
    return f"{100 * p:.1f} [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"


def transfer_tables(quality: dict, guides: dict, domains_used: dict[str, Domain]) -> dict[str, tuple]:
    """The study's tables (columns, rows): ``step_quality`` (a meter per row, the states it reads per column, and the
    always-beneficial baseline) and ``guidance`` (per target domain: natural rollout, random selection, each meter)."""
    targets = list(next(iter(quality.values())).keys()) if quality else []
    rows = []
    for source, row in quality.items():
        rows.append([source, *(f"{percent(row[t]['accuracy'], tuple(row[t]['accuracy_ci']))}, bal. "
                               f"{100 * row[t]['balanced_accuracy']:.1f}, n = {row[t]['steps']} "
                               f"({row[t]['beneficial']}/{row[t]['harmful']}), ties {row[t]['ties']}"
                               for t in targets)])  # fmt: skip
    if quality:
        first = next(iter(quality.values()))
        rows.append(["always beneficial", *(f"{100 * first[t]['beneficial'] / first[t]['steps']:.1f}"
                                            if first[t]["steps"] else "–" for t in targets)])  # fmt: skip
    guide_rows = []
    for target, runs in guides.items():
        first = next(iter(runs.values()))
        n, arms = first["episodes"], {a["name"]: a for a in first["arms"]}
        where = f"{target} ({n} episodes, {domains_used[target].heldout_split})"
        picked = [(name, arms[name]) for name in ("natural rollout", "random selection")]
        picked += [(f"meter trained on {source}", {a["name"]: a for a in result["arms"]}["progress meter"])
                   for source, result in runs.items()]  # fmt: skip
        guide_rows += [[where, name, percent(a["success"], wilson(round(a["success"] * n), n)), f"{a['steps']:.1f}"]
                       for name, a in picked]  # fmt: skip
    return {"step_quality": (("meter ↓ / read on →", *targets), rows),
            "guidance": (("target", "arm", "success % [95 % Wilson]", "steps"), guide_rows)}


def report(tables: dict[str, tuple], domains_used: dict[str, Domain], skipped: dict[str, str], argv: str) -> str:
    from deltattg.report import markdown_table

    lines = ["# Cross-domain transfer of progress meters (§5.3)", "",
             f"`bench/bench_transfer.py {argv}` — {time.strftime('%Y-%m-%d %H:%M')}, revision {revision()}.", "",
             "## Step quality", "",
             "Rows: the domain a meter was trained on; columns: the held-out states it reads. Each cell: accuracy % "
             "of Δ's sign against the step labels [95 % Wilson interval], balanced accuracy %, labelled steps "
             "(beneficial / harmful); ties (Δ = 0) count as wrong. Labels: the noisy expert's provenance (+1 its "
             "own action, −1 a deliberate mistake); `apb-hotpotqa`: AgentProcessBench's human labels. Last row: the "
             "accuracy of calling every step beneficial.", "", markdown_table(*tables["step_quality"])]  # fmt: skip
    if tables["guidance"][1]:
        lines += ["", "## Guidance", "",
                  f"`guide --actor {GUIDE_ACTOR} --candidates 4` on each domain's held-out split, seed 0: success % "
                  "[95 % Wilson interval] over the episodes (distinct tasks), average steps.", "",
                  markdown_table(*tables["guidance"])]  # fmt: skip
    notes = [f"{d.name}: {d.note}" for d in domains_used.values() if d.note]
    notes += [f"{name}: left out ({why})" for name, why in skipped.items()]
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", default="runs/transfer")
    parser.add_argument("--domains", nargs="+", default=["household", "alfworld", "bfcl", "tau2", "search", "awm"])
    parser.add_argument("--guide-targets", nargs="*", default=["household", "bfcl", "search", "awm"])
    parser.add_argument("--guide-meters", nargs="*", help="meters guiding each target, by domain; 'own' is the "
                        "target's own (default: all)")
    parser.add_argument("--alfworld", default=os.environ.get("ALFWORLD_DATA"), help="json_2.1.1 folder")
    parser.add_argument("--agentprocessbench", help="folder with hotpotqa.jsonl and split.json")
    parser.add_argument("--max-length", type=int, default=512, help="meter input budget in tokens (default 512)")
    parser.add_argument("--summary", help="the tables also as a summary (deltattg.summaries; what the docs' "
                        "transfer tables are generated from)")
    parser.add_argument("--report-only", action="store_true", help="run nothing new: report the pools, meters and "
                        "guidance cells already under --out")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    search_data = None
    if args.agentprocessbench and "search" in args.domains:
        search_data = out / "search-data"
        if not (search_data / "corpus.jsonl").exists():
            run_deltattg(["search-data", str(Path(args.agentprocessbench) / "hotpotqa.jsonl"), "--out", str(search_data)], log)
    available = domains(args.alfworld, search_data)
    skipped = {d: "no data: --alfworld / --agentprocessbench" for d in args.domains if d not in available}
    chosen = {d: available[d] for d in args.domains if d in available}

    heldout, folders = {}, {}
    if args.report_only:
        chosen = {name: d for name, d in chosen.items() if (out / name / "meter" / "meter_config.json").exists()}
    for name, domain in chosen.items():
        print(f"[transfer] {name}: pools and meter", file=sys.stderr)
        train, heldout[name] = pools(domain, out, log)
        folders[name] = meter(domain, train, out, log, args.max_length)

    meters = load_meters(folders)
    targets = {name: labelled(path) for name, path in heldout.items()}
    if args.agentprocessbench:
        apb = Path(args.agentprocessbench)
        targets["apb-hotpotqa"] = labelled(apb / "hotpotqa.jsonl", apb / "split.json")
    quality: dict[str, dict] = {name: {} for name in meters}
    for target, items in targets.items():
        print(f"[transfer] step quality on {target}: {len(items)} labelled trajectories", file=sys.stderr)
        cells = step_quality_cells(meters, target, items, out / "features" / f"{target}.pt")
        for name, cell in cells.items():
            quality[name][target] = cell

    guides: dict[str, dict] = {}
    for target in [t for t in args.guide_targets if t in chosen]:
        sources = [target if m == "own" else m for m in (args.guide_meters or list(folders))]
        for source in dict.fromkeys(s for s in sources if s in folders):
            if args.report_only and not (out / "guide" / f"{target}--{source}.json").exists():
                continue
            print(f"[transfer] guidance on {target} with the {source} meter", file=sys.stderr)
            guides.setdefault(target, {})[source] = guidance(chosen[target], source, folders[source], out, log)

    argv_used = list(argv if argv is not None else sys.argv[1:])
    tables = transfer_tables(quality, guides, chosen)
    text = report(tables, chosen, skipped, " ".join(argv_used))
    (out / "transfer.md").write_text(text)
    (out / "transfer.json").write_text(json.dumps({"step_quality": quality, "guidance": guides,
                                                   "skipped": skipped}, indent=2) + "\n")  # fmt: skip
    print(text)
    if args.summary:
        from deltattg.summaries import write_summary

        write_summary(args.summary, "bench_transfer", ["bench/bench_transfer.py", *argv_used], tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
