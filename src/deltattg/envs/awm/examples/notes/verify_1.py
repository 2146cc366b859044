import sqlite3


def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """Every note of user 1 with 'draft' in its title is archived; no other note's flag changed; none deleted."""
    with sqlite3.connect(initial_db_path) as before, sqlite3.connect(final_db_path) as after:
        was = dict(before.execute("SELECT id, archived FROM notes"))
        now = {row[0]: row[1:] for row in after.execute("SELECT id, user_id, title, archived FROM notes")}
    if set(was) - set(now):
        return {"result": "others"}
    for note_id, (user, title, archived) in now.items():
        want = 1 if (user == 1 and "draft" in title.lower()) else was.get(note_id, 0)
        if archived != want:
            return {"result": "others"}
    return {"result": "complete"}
