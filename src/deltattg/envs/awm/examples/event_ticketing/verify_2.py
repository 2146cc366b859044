import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """User 1's 'Cancelled Meetup' and its tiers are gone; every other event is still there."""
    with sqlite3.connect(initial_db_path) as before, sqlite3.connect(final_db_path) as after:
        gone = after.execute("SELECT COUNT(*) FROM events WHERE user_id = 1 AND name = 'Cancelled Meetup'").fetchone()[0] == 0
        orphans = after.execute("SELECT COUNT(*) FROM ticket_tiers WHERE event_id NOT IN (SELECT id FROM events)").fetchone()[0]
        others = before.execute("SELECT id FROM events WHERE NOT (user_id = 1 AND name = 'Cancelled Meetup')").fetchall()
        kept = after.execute("SELECT id FROM events").fetchall()
    return {"result": "complete" if gone and orphans == 0 and set(others) <= set(kept) else "others"}
