"""The AWM environment on our example scenarios in AWM's released format: the release read as released, the
database built from its SQL, the FastAPI code served as MCP in a real subprocess, verifiers in a time-limited
subprocess; the expert wins every task; episodes are isolated; a broken, dead or hanging server and a runaway
verifier end in a clear error or a failed step, never a hang."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

pytest.importorskip("fastapi_mcp", reason="the awm environment needs the [awm] extra")
pytest.importorskip("mcp")

from deltattg.cli import main  # noqa: E402
from deltattg.envs.awm import AWMEnv  # noqa: E402
from deltattg.envs.awm.env import parse_call  # noqa: E402
from deltattg.envs.awm.examples import write_examples  # noqa: E402
from deltattg.envs.awm.release import normalize_scenario_name, read_release  # noqa: E402
from deltattg.envs.awm.sandbox import build_database, patched_code, verify  # noqa: E402
from deltattg.envs.base import Describable, HasExpert, HasMistakes  # noqa: E402
from deltattg.envs.registry import rebuild  # noqa: E402
from deltattg.envs.tool_calls import Malformed  # noqa: E402
from deltattg.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    folder = tmp_path_factory.mktemp("awm")
    write_examples(folder)
    return folder


def rewrite(folder, name: str, change) -> None:
    path = folder / name
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(row)) + "\n" for row in rows))


def copy_release(release, tmp_path):
    for path in release.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


# ---- the release as released ---------------------------------------------------------------------------------------

def test_the_examples_are_an_awm_release(release):
    assert {p.name for p in release.iterdir()} >= {"gen_scenario.jsonl", "gen_tasks.jsonl", "gen_db.jsonl",
                                                   "gen_sample.jsonl", "gen_envs.jsonl", "gen_verifier.pure_code.jsonl"}
    data = read_release(release)
    assert sorted(data.scenarios) == ["event_ticketing", "notes"] and data.unplayable == 0
    assert {n: s.split for n, s in data.scenarios.items()} == {"event_ticketing": "train", "notes": "test"}
    assert normalize_scenario_name("E-Commerce  #33") == "e_commerce_33"
    env = AWMEnv(release)
    assert [t.id for t in env.tasks("test")] == ["notes/0", "notes/1", "notes/2"]
    assert len(env.tasks("all")) == 6 and [t.id for t in env.tasks("event_ticketing")][0] == "event_ticketing/0"
    with pytest.raises(ValueError, match="no split 'nosuch'"):
        env.tasks("nosuch")


def test_bad_release_records_name_file_line_and_field(release, tmp_path):
    folder = copy_release(release, tmp_path)
    rewrite(folder, "gen_tasks.jsonl", lambda row: {**row, "tasks": "do it"})
    with pytest.raises(InputError, match=r"gen_tasks.jsonl:1: tasks: must be a list"):
        read_release(folder)
    (folder / "gen_envs.jsonl").unlink()
    with pytest.raises(InputError, match="gen_envs.jsonl missing"):
        read_release(folder)


def test_a_task_without_a_verifier_is_counted_not_dropped_silently(release, tmp_path):
    folder = copy_release(release, tmp_path)
    rewrite(folder, "gen_verifier.pure_code.jsonl",
            lambda row: {**row, "verification": {"code": None}} if row["task_idx"] == 1 else row)
    data = read_release(folder)
    assert data.unplayable == 2 and sorted(data.scenarios["notes"].verifiers) == [0, 2]


# ---- sandbox pieces ------------------------------------------------------------------------------------------------

def test_the_database_is_built_from_the_released_sql_and_bad_inserts_are_counted(tmp_path, release):
    scenario = read_release(release).scenarios["notes"]
    sample = {"tables": [{"insert_statements": [*scenario.sample_data["tables"][0]["insert_statements"],
                                                "INSERT INTO notes (id) VALUES ('broken"]}]}  # fmt: skip
    report = build_database(tmp_path / "n.db", scenario.db_schema, sample)
    assert (report.tables, report.failed_tables, report.inserts, report.failed_inserts) == (1, 0, 6, 1)


def test_the_code_is_bound_to_the_episode_database_and_mounted_as_mcp(tmp_path):
    code = 'engine = create_engine(DATABASE_PATH, connect_args={})\nif __name__ == "__main__":\n    uvicorn.run(app, port=1)'
    db = tmp_path / "final.db"
    patched = patched_code(code, str(db)).splitlines()
    assert f"engine = create_engine('sqlite:///{db}', connect_args={{'check_same_thread': False}})" in patched
    i = patched.index("    FastApiMCP(app).mount_http()")
    assert patched[i - 1] == "    from fastapi_mcp import FastApiMCP" and patched[i + 1].startswith("    uvicorn.run(app, ")


def test_a_runaway_or_failing_verifier_is_a_verdict_within_its_limit(tmp_path, release):
    db = tmp_path / "a.db"
    build_database(db, read_release(release).scenarios["notes"].db_schema, {"tables": []})
    started = time.monotonic()
    slow = verify("def verify_task_completion(initial_db_path, final_db_path):\n    while True:\n        pass\n",
                  db, db, None, tmp_path, timeout_s=2)  # fmt: skip
    assert slow == {"result": "error", "error": "the verifier ran past its 2 s limit"}
    assert time.monotonic() - started < 10
    raises = verify("def verify_task_completion(final_db_path):\n    raise KeyError('x')\n", db, db, "", tmp_path)
    assert raises["result"] == "error" and "KeyError" in raises["error"]
    wrong = verify("def verify_task(a, b):\n    return 1\n", db, db, "", tmp_path)
    assert wrong["result"] == "error" and "not a dict" in wrong["error"]
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO notes (user_id, title, body) VALUES (1, 't', 'b')")
    deletes = verify("import sqlite3\ndef verify_task_completion(initial_db_path, final_db_path, final_answer):\n"
                     "    with sqlite3.connect(final_db_path) as db:\n        db.execute('DELETE FROM notes')\n"
                     "    return {'result': 'complete'}\n", db, db, "", tmp_path)  # fmt: skip
    assert deletes["result"] in ("complete", "error")  # read-only copies (root may still write to its copy)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 1  # the episode's database is untouched


# ---- episodes ------------------------------------------------------------------------------------------------------

def test_actions_in_awms_protocol():
    assert parse_call('<tool_call>\n{"name": "list_tools", "arguments": null}\n</tool_call>') == ("list_tools", {})
    call = {"name": "call_tool", "arguments": {"tool_name": "mcp_tool_create_note", "arguments": '{"title": "a"}'}}
    assert parse_call(f"Let me do it. <tool_call>{json.dumps(call)}</tool_call>") == ("create_note", {"title": "a"})
    assert parse_call('{"name": "archive_note", "arguments": {"note_id": 2}}') == ("archive_note", {"note_id": 2})
    assert parse_call("All done: it has 2 tiers.") is None
    for bad in ('<tool_call>{"name": "call_tool", "arguments": {"arguments": "{}"}}</tool_call>',
                '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "x", "arguments": "{no"}}</tool_call>',
                "<tool_call>{oops</tool_call>"):  # fmt: skip
        with pytest.raises(Malformed):
            parse_call(bad)


def test_the_expert_wins_every_example_task_and_the_verifier_judges_the_database(release):
    env = AWMEnv(release)
    assert isinstance(env, (HasExpert)) and isinstance(env, HasMistakes) and isinstance(env, Describable)
    for task in env.tasks("all"):
        env.reset(task)
        while not (result := env.step(env.expert_action())).done:
            assert result.info["verified"], result.observation
        assert result.won and result.reward == 1.0 and result.info["verdict"] == {"result": "complete"}, task.id
    env.reset(env.tasks("all")[0])  # the paper's Appendix F task, stopped half-way: not complete
    env.step(env.expert_action())
    env.step(env.expert_action())
    half = env.step("I created the event and one tier.")
    assert half.done and half.reward == 0.0 and half.info["verdict"] == {"result": "others"}
    env.close()


def test_failed_steps_and_a_listing_of_the_tools(release):
    env = AWMEnv(release, max_steps=4)
    env.reset(env.tasks("notes")[2])
    listing = env.step('<tool_call>{"name": "list_tools", "arguments": null}</tool_call>')
    assert "1. mcp_tool_list_notes" in listing.observation and "query (string, optional)" in listing.observation
    assert env.step("<tool_call>{oops</tool_call>").observation.startswith("Error: invalid JSON")
    unknown = env.step('{"name": "drop_table", "arguments": {}}')
    assert unknown.observation.startswith("Error: Unknown tool 'drop_table'") and not unknown.info["verified"]
    last = env.step(env.call_text("archive_note", {"note_id": 99}))  # a tool error, and the turn limit
    assert "no note 99" in last.observation and last.done and last.info["truncated"] and last.reward == 0.0


def test_episodes_are_isolated_and_mistakes_are_plausible(release):
    first, second = AWMEnv(release), AWMEnv(release)
    task = first.tasks("notes")[0]
    first.reset(task)
    second.reset(task)
    first.step(first.expert_action())  # creates 'Groceries' in the first episode's database only
    listed = json.loads(second.step(second.call_text("list_notes", {"query": "Groceries"})).observation or "[]")
    assert listed == []
    rng = random.Random(0)
    mistakes = {second.mistaken_action(rng) for _ in range(30)}
    assert "I could not complete this task." in mistakes
    calls = [parse_call(m) for m in mistakes if "<tool_call>" in m]
    gold = ("create_note", {"title": "Groceries", "body": "milk, eggs, bread"})
    assert any(name == gold[0] and arguments != gold[1] for name, arguments in calls)  # a wrong argument
    assert any(name != gold[0] and arguments == gold[1] for name, arguments in calls)  # another tool
    again = rebuild(json.loads(json.dumps(first.describe())))()
    assert [t.id for t in again.tasks("all")] == [t.id for t in first.tasks("all")]
    first.close()
    second.close()


def test_a_dead_or_hanging_server_is_a_failed_step_that_ends_the_episode(release):
    env = AWMEnv(release, tool_timeout_s=2)
    env.reset(env.tasks("notes")[0])
    env.step('<tool_call>{"name": "list_tools", "arguments": null}</tool_call>')
    os.killpg(env._server.process.pid, signal.SIGKILL)
    env._server.process.wait()
    dead = env.step(env.expert_action())
    assert dead.done and dead.reward == 0.0 and "server exited" in dead.info["error"]
    env.reset(env.tasks("notes")[0])
    env.step('<tool_call>{"name": "list_tools", "arguments": null}</tool_call>')
    os.killpg(env._server.process.pid, signal.SIGSTOP)  # alive, never answers
    started = time.monotonic()
    hung = env.step(env.expert_action())
    assert time.monotonic() - started < 30
    assert hung.done and "within 2 s" in hung.info["error"]
    env.close()


def test_a_scenario_whose_code_does_not_run_is_a_clear_error(release, tmp_path, capsys):
    folder = copy_release(release, tmp_path)
    rewrite(folder, "gen_envs.jsonl", lambda row: {**row, "full_code": "import no_such_module\n" + row["full_code"]})
    env = AWMEnv(folder)
    assert env.reset(env.tasks("all")[0]).startswith("Create an event")  # the server starts at the first step
    with pytest.raises(InputError, match=r"gen_envs.jsonl: full_code: scenario event_ticketing: .*exited.*"
                                         r"No module named 'no_such_module'"):
        env.step(env.expert_action())
    code = main(["collect", "--env", "awm", "--data", str(folder), "--policy", "expert", "--episodes", "1",
                 "--out", str(tmp_path / "pool.jsonl"), "--no-progress"])  # fmt: skip
    assert code == 2 and "No module named 'no_such_module'" in capsys.readouterr().err
    assert not (tmp_path / "pool.jsonl").exists()


def test_evaluate_reports_by_scenario_on_the_shipped_scenarios_by_default(tmp_path):
    out = tmp_path / "ev"
    assert main(["evaluate", "--env", "awm", "--actor", "expert", "--episodes", "6", "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["breakdown"] == "scenario" and results["overall"]["success"] == 1.0
    assert {k: v["episodes"] for k, v in results["by_type"].items()} == {"event_ticketing": 3, "notes": 3}


def test_a_task_index_must_be_an_integer_not_a_boolean(release):
    """``task_idx: true`` (a crafted or corrupted record) was played as task 1 (``True == 1`` in a dict lookup)."""
    from dataclasses import replace

    env = AWMEnv(release)
    task = env.tasks("all")[1]
    assert task.data["task_idx"] == 1
    for bad in (True, "1", 1.0, None):
        with pytest.raises(ValueError, match="not a playable task"):
            env.reset(replace(task, data={**task.data, "task_idx": bad}))
    env.close()
