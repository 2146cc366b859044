"""Notes: a personal note-taking app with search and an archive."""

import os
from typing import List, Optional

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Boolean, Column, Integer, String, create_engine
from sqlalchemy.orm import declarative_base, sessionmaker

DATABASE_PATH = os.getenv("DATABASE_PATH") or "sqlite:///notes.db"
engine = create_engine(DATABASE_PATH, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine)
Base = declarative_base()


class Note(Base):
    __tablename__ = "notes"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, nullable=False)
    title = Column(String, nullable=False)
    body = Column(String, nullable=False)
    archived = Column(Boolean, nullable=False, default=False)


Base.metadata.create_all(engine)


class NoteIn(BaseModel):
    title: str
    body: str


class NoteOut(NoteIn):
    id: int
    archived: bool


app = FastAPI(title="Notes")


def _out(note: Note) -> NoteOut:
    return NoteOut(id=note.id, title=note.title, body=note.body, archived=note.archived)


def _note(session, note_id: int) -> Note:
    note = session.get(Note, note_id)
    if note is None or note.user_id != 1:
        raise HTTPException(status_code=404, detail=f"no note {note_id}")
    return note


@app.get("/notes", operation_id="list_notes", summary="List or search my notes", tags=["notes"],
         description="My notes, optionally only those whose title contains `query` and/or with the given archived flag.",
         response_model=List[NoteOut])
def list_notes(query: Optional[str] = None, archived: Optional[bool] = None):
    with SessionLocal() as session:
        notes = session.query(Note).filter(Note.user_id == 1)
        if query:
            notes = notes.filter(Note.title.contains(query))
        if archived is not None:
            notes = notes.filter(Note.archived == archived)
        return [_out(n) for n in notes.order_by(Note.id)]


@app.post("/notes", operation_id="create_note", summary="Create a note", tags=["notes"],
          description="Create a note with a title and a body.", response_model=NoteOut)
def create_note(body: NoteIn):
    with SessionLocal() as session:
        note = Note(user_id=1, title=body.title, body=body.body, archived=False)
        session.add(note)
        session.commit()
        return _out(note)


@app.post("/notes/{note_id}/archive", operation_id="archive_note", summary="Archive a note", tags=["notes"],
          description="Move one of my notes to the archive.", response_model=NoteOut)
def archive_note(note_id: int):
    with SessionLocal() as session:
        note = _note(session, note_id)
        note.archived = True
        session.commit()
        return _out(note)


@app.delete("/notes/{note_id}", operation_id="delete_note", summary="Delete a note", tags=["notes"],
            description="Delete one of my notes for good.")
def delete_note(note_id: int):
    with SessionLocal() as session:
        session.delete(_note(session, note_id))
        session.commit()
        return {"deleted": note_id}


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
