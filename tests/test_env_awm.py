"""The AWM environment on our example scenarios in AWM's released format: the release read as released, the
database built from its SQL, the FastAPI code served as MCP in a real subprocess, verifiers in a time-limited
subprocess; the expert wins every task; episodes are isolated; a broken, dead or hanging server and a runaway
verifier end in a clear error or a failed step, never a hang."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi_mcp", reason="the awm environment needs the [awm] extra")
pytest.importorskip("mcp")

from conftest import exit_status, save_household_tokenizer, skip_here  # noqa: E402

from deltattg.cli import main  # noqa: E402
from deltattg.envs.awm import AWMEnv  # noqa: E402
from deltattg.envs.awm.env import parse_call, tool_listing  # noqa: E402
from deltattg.envs.awm.examples import write_examples  # noqa: E402
from deltattg.envs.awm.release import normalize_scenario_name, read_release  # noqa: E402
from deltattg.envs.awm.sandbox import build_database, patched_code, verify  # noqa: E402
from deltattg.envs.base import Describable, HasExpert, HasMistakes  # noqa: E402
from deltattg.envs.registry import rebuild  # noqa: E402
from deltattg.envs.tool_calls import Malformed  # noqa: E402
from deltattg.errors import InputError  # noqa: E402
from deltattg.rollout.engine import service_error  # noqa: E402


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
    tmp_path.mkdir(parents=True, exist_ok=True)
    for path in release.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


def with_notes_code(release, folder, code: str):
    """A copy of the release whose notes scenario runs ``code`` as its server."""
    copy_release(release, folder)
    rewrite(folder, "gen_envs.jsonl",
            lambda row: {**row, "full_code": code} if normalize_scenario_name(row["scenario"]) == "notes" else row)
    return folder


def gone(pid: int) -> bool:
    """The process ``pid`` has ended (a zombie nobody has reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_until(condition, seconds: float = 60.0) -> bool:
    """``condition()`` became true within a generous deadline (never a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def linux_only() -> None:
    if not sys.platform.startswith("linux"):
        skip_here("reads /proc and relies on Linux's parent-death signal")


LIST_TOOLS = '<tool_call>{"name": "list_tools", "arguments": null}</tool_call>'
NOTES_LISTING = """Available MCP Tools (4 tools):
================================================================================

1. mcp_tool_list_notes
   Description: List or search my notes
   My notes, optionally only those whose title contains `query` and/or with the given archived flag.
   ### Responses:
   **200**: Successful Response (Success Response)
   Content-Type: application/json
   **Example Response:**
   ```json
   [
   {
   "title": "Title",
   "body": "Body",
   "id": 1,
   "archived": true
   }
   ]
   ```
   Parameters:
      - query: string (optional)
      - archived: boolean (optional)

2. mcp_tool_create_note
   Description: Create a note
   Create a note with a title and a body.
   ### Responses:
   **200**: Successful Response (Success Response)
   Content-Type: application/json
   **Example Response:**
   ```json
   {
   "title": "Title",
   "body": "Body",
   "id": 1,
   "archived": true
   }
   ```
   Parameters:
      - title: string (required)
      - body: string (required)

3. mcp_tool_archive_note
   Description: Archive a note
   Move one of my notes to the archive.
   ### Responses:
   **200**: Successful Response (Success Response)
   Content-Type: application/json
   **Example Response:**
   ```json
   {
   "title": "Title",
   "body": "Body",
   "id": 1,
   "archived": true
   }
   ```
   Parameters:
      - note_id: integer (required)

4. mcp_tool_delete_note
   Description: Delete a note
   Delete one of my notes for good.
   ### Responses:
   **200**: Successful Response (Success Response)
   Content-Type: application/json
   Parameters:
      - note_id: integer (required)"""  # AWM's format_tools_for_response (awm/core/agent.py) of the notes tools


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
    copy_release(release, folder)
    rewrite(folder, "gen_db.jsonl", lambda row: {**row, "db_schema": {"tables": 5}})
    with pytest.raises(InputError, match=r"gen_db.jsonl:1: db_schema.tables: must be a list of tables"):
        read_release(folder)
    copy_release(release, folder)
    rewrite(folder, "gen_sample.jsonl", lambda row: {**row, "sample_data": {"tables": [{"insert_statements": 7}]}})
    with pytest.raises(InputError, match=r"gen_sample.jsonl:1: sample_data.tables\[0\].insert_statements: must be a "
                                         r"list"):  # fmt: skip
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
    assert (report.tables, report.failed_tables, report.inserts, len(report.failed_inserts)) == (1, (), 6, 1)
    assert report.failed_inserts[0].startswith("sample_data.tables[0].insert_statements[5]: unrecognized token")


def test_the_code_is_bound_to_the_episode_database(tmp_path):
    code = 'engine = create_engine(DATABASE_PATH, connect_args={})\nif __name__ == "__main__":\n    uvicorn.run(app, port=1)'
    db = tmp_path / "final.db"
    patched = patched_code(code, str(db)).splitlines()
    assert f"engine = create_engine('sqlite:///{db}', connect_args={{'check_same_thread': False}})" in patched
    assert patched[-1] == "    uvicorn.run(app, port=1)"  # never run: run_server serves the app itself


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
    assert listing.observation == NOTES_LISTING
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


# ---- issue items: AWM's own behaviour, and what must never crash or leak --------------------------------------------

def test_list_tools_renders_every_part_of_a_schema_as_awm_does():
    """Descriptions line by line, each parameter's description, default, allowed values and nested properties; the
    list_tools meta-tool left out (the expected text is AWM's format_tools_for_response of these tools)."""
    tools = [{"name": "list_tools", "description": "meta", "inputSchema": {}},
             {"name": "book_room", "description": "Book a room\n\n  Books one room.  \n\n### Responses:\n**200**: OK",
              "inputSchema": {"type": "object", "required": ["room", "guest"], "properties": {
                  "room": {"type": "integer", "description": "the room number"},
                  "kind": {"type": "string", "enum": ["single", "double"], "default": "single"},
                  "guest": {"type": "object", "description": "who stays", "required": ["name"], "properties": {
                      "name": {"type": "string"}, "age": {"type": "integer", "default": 0}}},
                  "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}},
             {"name": "mcp_tool_ping", "description": "", "inputSchema": {"type": "object", "properties": {}}}]
    assert tool_listing(tools) == """Available MCP Tools (2 tools):
================================================================================

1. mcp_tool_book_room
   Description: Book a room
   Books one room.
   ### Responses:
   **200**: OK
   Parameters:
      - room: integer (required)
        Description: the room number
      - kind: string (optional)
        Default: single
        Allowed values: ['single', 'double']
      - guest: object (required)
        Description: who stays
        Properties:
          - name: string (required)
          - age: integer (optional)
            Default: 0
      - notes: unknown (optional)

2. mcp_tool_ping
   Description:\x20
   Parameters: None"""


def test_the_expert_is_refused_up_front_on_a_release_without_gold_calls(release, tmp_path, capsys):
    folder = copy_release(release, tmp_path / "awm")
    (folder / "deltattg_gold.jsonl").unlink()  # as every AWM release
    collect = ["collect", "--env", "awm", "--data", str(folder), "--episodes", "1", "--no-progress"]
    assert exit_status([*collect, "--policy", "random", "--policy", "expert:0.2", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'deltattg_gold.jsonl'}, which is missing" in err and "Traceback" not in err
    assert exit_status(["evaluate", "--env", "awm", "--data", str(folder), "--actor", "expert", "--out",
                        str(tmp_path / "ev"), "--no-progress"]) == 2  # fmt: skip
    assert "deltattg_gold.jsonl, which is missing" in capsys.readouterr().err
    assert not (tmp_path / "p").exists() and not (tmp_path / "ev").exists()
    assert exit_status([*collect, "--policy", "random", "--out", str(tmp_path / "r")]) == 0  # other policies play
    tokenizer = save_household_tokenizer(tmp_path / "tok")  # labels count the completions' tokens in it
    assert exit_status(["labels", str(tmp_path / "r"), "--labels", "best-of-k", "--completer", "expert",
                        "--completions", "1", "--tokenizer", str(tokenizer), "--out", str(tmp_path / "L")]) == 2
    assert "--completer expert: " in (err := capsys.readouterr().err) and "deltattg_gold.jsonl, which is missing" in err
    assert not (tmp_path / "L").exists()


def test_verifiers_get_awms_preloaded_modules_and_none_of_the_callers_variables(tmp_path, release, monkeypatch):
    monkeypatch.setenv("DELTATTG_TEST_TOKEN", "secret")
    db = tmp_path / "a.db"
    build_database(db, read_release(release).scenarios["notes"].db_schema, {"tables": []})
    code = ("def verify_task_completion(initial_db_path, final_db_path, final_answer):\n"
            "    with sqlite3.connect(final_db_path) as db:\n"
            "        count = db.execute('SELECT COUNT(*) FROM notes').fetchone()[0]\n"
            "    clean = 'DELTATTG_TEST_TOKEN' not in os.environ\n"
            "    ok = count == 0 and clean and re.fullmatch(r'done', final_answer) and json.loads('[1]') == [1]\n"
            "    return {'result': 'complete' if ok else 'others'}\n")  # fmt: skip
    assert verify(code, db, db, "done", tmp_path) == {"result": "complete"}


def test_our_example_verifiers_judge_a_database_the_agent_broke_without_failing(tmp_path, release):
    """notes/2 ("the body of my note 'Wifi'") read the body from the final database: an agent that renamed or
    deleted the note made the verifier raise (a verifier error) instead of answering "others"."""
    scenario = read_release(release).scenarios["notes"]
    before, after = tmp_path / "before.db", tmp_path / "after.db"
    build_database(before, scenario.db_schema, scenario.sample_data)
    build_database(after, scenario.db_schema, scenario.sample_data)
    with sqlite3.connect(after) as db:
        db.execute("DELETE FROM notes WHERE title = 'Wifi'")
    for k, code in scenario.verifiers.items():
        verdict = verify(code, before, after, "", tmp_path)
        assert verdict["result"] == "others", (k, verdict)


def test_a_verifier_that_prints_exits_or_breaks_gives_its_verdict_or_an_error(tmp_path, release, caplog):
    db = tmp_path / "a.db"
    build_database(db, read_release(release).scenarios["notes"].db_schema, {"tables": []})
    chatty = ("def verify_task_completion(final_db_path):\n    print('checking', end='')\n"
              "    return {'result': 'complete'}\n")
    assert verify(chatty, db, db, "", tmp_path) == {"result": "complete"}
    exits = verify("import sys\ndef verify_task_completion(final_db_path):\n    sys.exit(0)\n", db, db, "", tmp_path)
    assert exits == {"result": "error", "error": "SystemExit: 0"}
    broken = verify("def verify_task_completion(final_db_path):\n    return {\n", db, db, "", tmp_path)
    assert broken["result"] == "error" and broken["error"].startswith("SyntaxError")
    dies = verify("import os\ndef verify_task_completion(final_db_path):\n    os._exit(3)\n", db, db, "", tmp_path)
    assert dies["result"] == "error" and "exited with status 3 without a verdict" in dies["error"]
    folder = copy_release(release, tmp_path / "awm")
    rewrite(folder, "gen_verifier.pure_code.jsonl", lambda row: {**row, "verification": {"code": "def verify_task("}})
    env = AWMEnv(folder)
    env.reset(env.tasks("notes")[0])
    with caplog.at_level(logging.WARNING, logger="deltattg.envs.awm.env"):
        last = env.step("Done.")
    env.close()
    assert last.done and not last.won and last.info["verdict"]["result"] == "error"
    assert "SyntaxError" in last.info["verdict"]["error"] and env.verifier_errors == 1
    assert "notes/0: its verifier failed" in caplog.text
    # the step's record keeps why (steps[].error), and collect / evaluate count it
    assert service_error(last.info).startswith("the task's verifier failed: SyntaxError")


def test_a_verifier_past_its_limit_is_killed_with_everything_it_started(tmp_path, release):
    linux_only()
    db = tmp_path / "a.db"
    build_database(db, read_release(release).scenarios["notes"].db_schema, {"tables": []})
    pid_file = tmp_path / "sleeper.pid"
    code = ("import subprocess\ndef verify_task_completion(final_db_path):\n"
            "    sleeper = subprocess.Popen(['sleep', '600'])\n"
            f"    open({str(pid_file)!r}, 'w').write(str(sleeper.pid))\n"
            "    while True:\n        pass\n")  # fmt: skip
    assert verify(code, db, db, "", tmp_path, timeout_s=5) == {"result": "error",
                                                                 "error": "the verifier ran past its 5 s limit"}
    assert wait_until(lambda: gone(int(pid_file.read_text())))


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_server_ends_with_the_process_that_started_it(signum, release, tmp_path):
    linux_only()
    script = ("import sys, time\nfrom deltattg.envs.awm import AWMEnv\nenv = AWMEnv(sys.argv[1])\n"
              "env.reset(env.tasks('notes')[0])\n"
              "env.step('<tool_call>{\"name\": \"list_tools\", \"arguments\": null}</tool_call>')\n"
              "print(env._server.process.pid, env._folder, flush=True)\ntime.sleep(600)\n")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script, str(release)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(tmp_path)})  # its database cache stays in tmp_path
    try:
        pid, folder = child.stdout.readline().split()
        assert not gone(int(pid)) and Path(folder, "server.py").is_file()
    finally:
        child.send_signal(signum)
        child.wait()
    assert wait_until(lambda: gone(int(pid)))
    assert wait_until(lambda: not Path(folder).exists())


def test_the_scenario_is_served_on_loopback_with_mcp_however_it_calls_uvicorn(release, tmp_path, monkeypatch):
    linux_only()
    monkeypatch.setenv("DELTATTG_TEST_TOKEN", "secret")
    split_call = 'uvicorn.run(\n        app,\n        host="0.0.0.0",\n        port=port,\n    )'
    code = (Path(__file__).parents[1] / "src/deltattg/envs/awm/examples/notes/server.py").read_text().replace(
        "uvicorn.run(app, host=host, port=port)", split_call)
    assert 'host="0.0.0.0"' in code
    env = AWMEnv(with_notes_code(release, tmp_path / "awm", code))
    env.reset(env.tasks("notes")[0])
    assert env.step(LIST_TOOLS).observation == NOTES_LISTING  # the MCP mount is there
    port = f"{env._server.port:04X}"
    listening = [line.split()[1] for name in ("tcp", "tcp6") if Path(f"/proc/net/{name}").is_file()
                 for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]
                 if line.split()[1].endswith(f":{port}") and line.split()[3] == "0A"]  # fmt: skip
    assert listening == [f"0100007F:{port}"]  # 127.0.0.1 only
    environ = Path(f"/proc/{env._server.process.pid}/environ").read_bytes().split(b"\0")
    assert any(v.startswith(b"PATH=") for v in environ)
    assert not any(v.startswith(b"DELTATTG_TEST_TOKEN=") for v in environ)
    env.close()


NEVER_MCP = """import os, socket, time
listener = socket.socket()
listener.bind(("127.0.0.1", int(os.environ["PORT"])))
listener.listen()
time.sleep(3600)
"""
DIES = NEVER_MCP.replace("time.sleep(3600)", "listener.accept()\nos._exit(3)")


def test_a_server_that_never_speaks_mcp_or_dies_first_is_a_failed_episode(release, tmp_path):
    env = AWMEnv(with_notes_code(release, tmp_path / "mute", NEVER_MCP), tool_timeout_s=3)
    env.reset(env.tasks("notes")[0])
    assert env.tool_schemas() == []  # what the random policy asks first
    mute = env.step(LIST_TOOLS)
    env.close()
    assert mute.done and mute.reward == 0.0 and "did not list its tools" in mute.info["error"]
    assert mute.observation.startswith("Error: the scenario's server did not list its tools")
    dies = with_notes_code(release, tmp_path / "dies", DIES)
    common = ["--env", "awm", "--data", str(dies), "--split", "notes", "--no-progress"]
    assert exit_status(["collect", *common, "--policy", "random", "--episodes", "1", "--out",
                        str(tmp_path / "p.jsonl")]) == 0  # fmt: skip
    record = json.loads((tmp_path / "p.jsonl").read_text())
    assert not record["success"] and "did not list its tools" in record["messages"][-1]["content"]
    assert exit_status(["evaluate", *common, "--actor", "random", "--episodes", "1", "--out",
                        str(tmp_path / "ev")]) == 0  # fmt: skip
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["overall"]["success"] == 0.0


def test_awm_examples_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    out = tmp_path / "awm"
    out.mkdir()
    assert exit_status(["awm-examples", "--out", str(out)]) == 0  # an empty folder is fine
    assert exit_status(["awm-examples", "--out", str(out)]) == 2
    assert f"--out {out} is not empty" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert exit_status(["awm-examples", "--out", str(tmp_path / "mine")]) == 2
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


# ---- issue 46: a terminated or killed collect leaves no folders; a broken database is said ---------------------------

def started_collect(release, tmp: Path) -> subprocess.Popen:
    """``deltattg collect --env awm`` in another process with ``tmp`` as its temporary folder, once it has started an
    episode's server (random episodes run up to 20 turns: long enough to be stopped in the middle)."""
    argv = [sys.executable, "-m", "deltattg", "collect", "--env", "awm", "--data", str(release), "--split", "all",
            "--policy", "random", "--episodes", "2", "--out", str(tmp / "pool.jsonl"), "--no-progress"]  # fmt: skip
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(tmp)})  # fmt: skip
    if not wait_until(lambda: any(tmp.glob("*/server.py")) or child.poll() is not None, 120):
        child.kill()
    assert child.poll() is None, f"collect ended before an episode started: {child.communicate()[1]}"
    return child


def test_a_terminated_collect_removes_its_databases_and_episode_folders(release, tmp_path):
    """SIGTERM (what Slurm and Kubernetes send) left the template databases' folder and episode folders behind."""
    linux_only()
    child = started_collect(release, tmp_path)
    child.send_signal(signal.SIGTERM)
    err = child.communicate()[1]
    assert child.returncode == 130 and "interrupted" in err, err  # Ctrl-C's path
    assert wait_until(lambda: sorted(p.name for p in tmp_path.iterdir()) == []), list(tmp_path.iterdir())


def test_sigterm_is_an_interrupt_only_where_nobody_else_handles_it():
    """The command line's SIGTERM handler is installed for the run only, and never over an application's own."""
    from deltattg.envs.awm.sandbox import sigterm_as_interrupt

    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the signal arrives first
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            assert wait_until(lambda: received == [signal.SIGTERM])
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

def test_the_next_start_removes_what_a_killed_collect_left_and_never_a_live_ones(release, tmp_path):
    """SIGKILL cannot be caught: the next start removes the folders of processes that are gone."""
    linux_only()
    from deltattg.envs.awm.sandbox import owned_prefix

    child = started_collect(release, tmp_path)
    child.kill()
    child.wait()
    left = [p for p in tmp_path.iterdir() if p.name != "pool.jsonl"]
    assert left and all(p.name.startswith(owned_prefix("", child.pid)[:-1]) for p in left)  # tagged with its pid
    live = tmp_path / f"{owned_prefix('databases', os.getpid())}x"  # this test's process is alive
    live.mkdir()
    assert subprocess.run([sys.executable, "-m", "deltattg", "collect", "--env", "awm", "--data", str(release),
                           "--split", "notes", "--policy", "expert", "--episodes", "1", "--out",
                           str(tmp_path / "next.jsonl"), "--no-progress"], env={**os.environ, "TMPDIR": str(tmp_path)},
                          stdout=subprocess.DEVNULL).returncode == 0  # fmt: skip
    assert not any(p.exists() for p in left) and live.is_dir()


def test_a_scenario_whose_database_does_not_build_is_named_on_stderr(release, tmp_path):
    """A broken DDL statement (and the inserts into its table) failed silently: the tasks ran on a database without
    the table, and only their verifiers' errors hinted at why."""
    folder = copy_release(release, tmp_path / "awm")

    def broken(row):
        if normalize_scenario_name(row["scenario"]) != "notes":
            return row
        tables = [{**t, "ddl": t["ddl"].replace("CREATE TABLE", "CREATE TABLE (")} for t in row["db_schema"]["tables"]]
        return {**row, "db_schema": {**row["db_schema"], "tables": tables}}

    rewrite(folder, "gen_db.jsonl", broken)
    result = subprocess.run([sys.executable, "-m", "deltattg", "collect", "--env", "awm", "--data", str(folder),
                             "--split", "all", "--policy", "expert", "--episodes", "6", "--out",
                             str(tmp_path / "p.jsonl"), "--no-progress"], capture_output=True, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    warnings = [line for line in result.stderr.splitlines() if "did not build" in line]
    assert len(warnings) == 1, result.stderr  # once, for notes only
    assert f"{folder / 'gen_db.jsonl'}: scenario notes:" in warnings[0]
    assert "db_schema.tables[0] (notes): near \"(\": syntax error" in warnings[0]
    assert f"{folder / 'gen_sample.jsonl'}: scenario notes: 5 of 5 sample inserts failed" in result.stderr
    assert "sample_data.tables[0].insert_statements[0]: no such table: notes" in result.stderr
    report = build_database(tmp_path / "n.db", read_release(folder).scenarios["notes"].db_schema, {"tables": []})
    assert (report.tables, len(report.failed_tables), report.inserts, report.failed_inserts) == (1, 1, 0, ())
