import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """A new 'Spring Gala' event of user 1 on 2026-05-01 at City Hall with exactly the three tiers asked for."""
    with sqlite3.connect(final_db_path) as db:
        events = db.execute("SELECT id, date, venue FROM events WHERE user_id = 1 AND name = 'Spring Gala'").fetchall()
        if len(events) != 1 or events[0][1:] != ("2026-05-01", "City Hall"):
            return {"result": "others"}
        tiers = sorted(db.execute("SELECT name, price, quantity FROM ticket_tiers WHERE event_id = ?",
                                  (events[0][0],)).fetchall())
    want = sorted([("General", 25.0, 200), ("VIP", 80.0, 50), ("Backstage", 150.0, 10)])
    return {"result": "complete" if tiers == want else "others"}
