import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """Exactly one new, unarchived note of user 1: 'Groceries' / 'milk, eggs, bread'."""
    with sqlite3.connect(initial_db_path) as before, sqlite3.connect(final_db_path) as after:
        old = {row[0] for row in before.execute("SELECT id FROM notes")}
        new = [row[1:] for row in after.execute("SELECT id, user_id, title, body, archived FROM notes")
               if row[0] not in old]
    return {"result": "complete" if new == [(1, "Groceries", "milk, eggs, bread", 0)] else "others"}
