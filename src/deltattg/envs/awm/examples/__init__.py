"""Small AWM scenarios of our own, in the released format, for tests and the CPU recipe (``deltattg awm-examples``).

Each folder here is one scenario: ``scenario.json`` (name, description, db_schema, sample_data, tasks, gold calls),
``server.py`` (the FastAPI app, as AWM generates them: SQLAlchemy ORM, ``DATABASE_PATH``, a uvicorn entry point) and
``verify_N.py`` (task N's code-mode verifier). :func:`write_examples` writes them as AWM's JSONL files
(:mod:`deltattg.envs.awm.release`) plus ``deltattg_gold.jsonl`` and ``deltattg_split.json`` (scenarios whose
``scenario.json`` says ``"split": "test"`` are held out).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from deltattg.data.jsonl import atomic_output, write_jsonl


def example_names() -> list[str]:
    root = resources.files(__name__)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "scenario.json").is_file())


def write_examples(folder: str | os.PathLike) -> dict[str, int]:
    """Write the example scenarios as an AWM release folder; ``{file: records}``."""
    rows: dict[str, list[dict]] = {name: [] for name in ("gen_scenario", "gen_tasks", "gen_db", "gen_sample",
                                                          "gen_envs", "gen_verifier.pure_code", "deltattg_gold")}
    root = resources.files(__name__)
    held_out: list[str] = []
    for name in example_names():
        part = root / name
        spec = json.loads((part / "scenario.json").read_text())
        scenario = spec["name"]
        if spec.get("split") == "test":
            held_out.append(scenario)
        rows["gen_scenario"].append({"name": scenario, "description": spec["description"]})
        rows["gen_tasks"].append({"scenario": scenario, "tasks": spec["tasks"]})
        rows["gen_db"].append({"scenario": scenario, "db_schema": spec["db_schema"], "db_path": f"{name}.db"})
        rows["gen_sample"].append({"scenario": scenario, "sample_data": spec["sample_data"]})
        rows["gen_envs"].append({"scenario": scenario, "db_path": f"{name}.db",
                                 "full_code": (part / "server.py").read_text()})
        for index, task in enumerate(spec["tasks"]):
            code = (part / f"verify_{index}.py").read_text()
            rows["gen_verifier.pure_code"].append({"scenario": scenario, "task_idx": index, "task": task,
                                                   "verification": {"code": code, "raw_response": ""}})
        rows["deltattg_gold"] += [{"scenario": scenario, **gold} for gold in spec.get("gold", [])]
    counts = {f"{name}.jsonl": write_jsonl(Path(folder) / f"{name}.jsonl", records) for name, records in rows.items()}
    with atomic_output(Path(folder) / "deltattg_split.json") as handle:
        handle.write(json.dumps({"test": held_out}) + "\n")
    return counts


def shipped_release() -> str:
    """A release folder holding the example scenarios (the awm environment's default ``data``): written once under
    the temporary folder, named by a hash of the examples' files, so every process and rebuild finds the same one."""
    root = resources.files(__name__)
    digest = hashlib.sha256()
    for name in example_names():
        for part in sorted((root / name).iterdir(), key=lambda p: p.name):
            if part.is_file():
                digest.update(part.name.encode() + part.read_bytes())
    folder = Path(tempfile.gettempdir()) / f"deltattg-awm-examples-{digest.hexdigest()[:12]}"
    if not (folder / "deltattg_split.json").is_file():  # written last: its presence means the folder is complete
        staging = Path(tempfile.mkdtemp(prefix=".deltattg-awm-examples-", dir=tempfile.gettempdir()))
        write_examples(staging)
        try:
            staging.rename(folder)
        except OSError:  # another process got there first
            shutil.rmtree(staging, ignore_errors=True)
    return str(folder)
