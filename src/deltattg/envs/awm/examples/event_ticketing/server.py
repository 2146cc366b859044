"""Event ticketing: organisers create events and sell tickets in tiers (the paper's Appendix F task)."""

import os
from typing import List, Optional

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Column, Float, ForeignKey, Integer, String, create_engine
from sqlalchemy.orm import declarative_base, sessionmaker

DATABASE_PATH = os.getenv("DATABASE_PATH") or "sqlite:///event_ticketing.db"
engine = create_engine(DATABASE_PATH, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine)
Base = declarative_base()


class Event(Base):
    __tablename__ = "events"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, nullable=False)
    name = Column(String, nullable=False)
    date = Column(String, nullable=False)
    venue = Column(String, nullable=False)


class TicketTier(Base):
    __tablename__ = "ticket_tiers"
    id = Column(Integer, primary_key=True)
    event_id = Column(Integer, ForeignKey("events.id"), nullable=False)
    name = Column(String, nullable=False)
    price = Column(Float, nullable=False)
    quantity = Column(Integer, nullable=False)


Base.metadata.create_all(engine)


class EventIn(BaseModel):
    name: str
    date: str
    venue: str


class EventOut(EventIn):
    id: int


class TierIn(BaseModel):
    name: str
    price: float
    quantity: int


class TierOut(TierIn):
    id: int
    event_id: int


app = FastAPI(title="Event ticketing")


def _event(session, event_id: int) -> Event:
    event = session.get(Event, event_id)
    if event is None or event.user_id != 1:
        raise HTTPException(status_code=404, detail=f"no event {event_id}")
    return event


@app.get("/events", operation_id="list_events", summary="List my events", tags=["events"],
         description="Every event of the logged-in organiser, optionally those whose name contains `name`.",
         response_model=List[EventOut])
def list_events(name: Optional[str] = None):
    with SessionLocal() as session:
        query = session.query(Event).filter(Event.user_id == 1)
        if name:
            query = query.filter(Event.name.contains(name))
        return [EventOut(id=e.id, name=e.name, date=e.date, venue=e.venue) for e in query.order_by(Event.id)]


@app.post("/events", operation_id="create_event", summary="Create an event", tags=["events"],
          description="Create an event (date as YYYY-MM-DD) owned by the logged-in organiser.", response_model=EventOut)
def create_event(body: EventIn):
    with SessionLocal() as session:
        event = Event(user_id=1, name=body.name, date=body.date, venue=body.venue)
        session.add(event)
        session.commit()
        return EventOut(id=event.id, name=event.name, date=event.date, venue=event.venue)


@app.delete("/events/{event_id}", operation_id="delete_event", summary="Delete an event", tags=["events"],
            description="Delete one of my events and all its ticket tiers.")
def delete_event(event_id: int):
    with SessionLocal() as session:
        event = _event(session, event_id)
        session.query(TicketTier).filter(TicketTier.event_id == event_id).delete()
        session.delete(event)
        session.commit()
        return {"deleted": event_id}


@app.post("/events/{event_id}/tiers", operation_id="create_ticket_tier", summary="Add a ticket tier",
          tags=["tickets"], description="Add a ticket tier (name, price, number of tickets) to one of my events.",
          response_model=TierOut)
def create_ticket_tier(event_id: int, body: TierIn):
    with SessionLocal() as session:
        _event(session, event_id)
        tier = TicketTier(event_id=event_id, name=body.name, price=body.price, quantity=body.quantity)
        session.add(tier)
        session.commit()
        return TierOut(id=tier.id, event_id=event_id, name=tier.name, price=tier.price, quantity=tier.quantity)


@app.get("/events/{event_id}/tiers", operation_id="list_ticket_tiers", summary="List an event's ticket tiers",
         tags=["tickets"], description="The ticket tiers of one of my events.", response_model=List[TierOut])
def list_ticket_tiers(event_id: int):
    with SessionLocal() as session:
        _event(session, event_id)
        tiers = session.query(TicketTier).filter(TicketTier.event_id == event_id).order_by(TicketTier.id)
        return [TierOut(id=t.id, event_id=t.event_id, name=t.name, price=t.price, quantity=t.quantity) for t in tiers]


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
