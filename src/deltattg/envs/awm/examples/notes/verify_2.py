import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """The answer contains the body of user 1's note 'Wifi'; the database is unchanged."""
    with sqlite3.connect(initial_db_path) as before, sqlite3.connect(final_db_path) as after:
        body = before.execute("SELECT body FROM notes WHERE user_id = 1 AND title = 'Wifi'").fetchone()[0]
        same = before.execute("SELECT * FROM notes ORDER BY id").fetchall() == after.execute(
            "SELECT * FROM notes ORDER BY id").fetchall()
    return {"result": "complete" if same and body in (final_answer or "") else "others"}
