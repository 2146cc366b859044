import re
import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """The answer states the number of tiers of user 1's 'Jazz Night' (2), and nothing was changed."""
    with sqlite3.connect(initial_db_path) as before, sqlite3.connect(final_db_path) as after:
        query = ("SELECT COUNT(*) FROM ticket_tiers t JOIN events e ON t.event_id = e.id "
                 "WHERE e.user_id = 1 AND e.name = 'Jazz Night'")
        count = after.execute(query).fetchone()[0]
        unchanged = all(before.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
                        == after.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
                        for t in ("events", "ticket_tiers"))
    numbers = re.findall(r"\b\d+\b", final_answer or "")
    return {"result": "complete" if unchanged and str(count) in numbers else "others"}
