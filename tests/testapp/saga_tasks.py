"""An order as a saga: reserve stock, charge the card, ship; and what undoes each.

Every body leaves SideEffect rows: ``<name>-run:<order>`` per run (what a
kill repeats) and ``<name>:<order>`` per effect (what must happen once).
"""

import os
import time

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.dependencies import Workflow
from django_rdbtasks.idempotency import once
from django_rdbtasks.limits import ConcurrencyLimit

from .models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


def _ran(name, order_id):
    SideEffect.objects.create(key=f"{name}-run:{order_id}", pid=os.getpid())


def _effect(name, order_id):
    """The effect, at most once per order: recorded in the idempotency ledger with it."""
    _ran(name, order_id)
    with once(name, key=order_id):
        SideEffect.objects.create(key=f"{name}:{order_id}", pid=os.getpid())


def _wait_for(key, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not SideEffect.objects.filter(key=key).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} never came")
        time.sleep(0.05)


@task(max_attempts=3, backoff=0)
def reserve_stock(order_id, sku, seconds=0.0):
    _effect("reserve", order_id)
    time.sleep(seconds)
    return {"reservation": f"R-{order_id}-{sku}"}


@task(max_attempts=3, backoff=0)
def charge_card(order_id, amount, pause_refund=False):
    _effect("charge", order_id)
    return {"charge": f"C-{order_id}-{amount}"}


@task(max_attempts=2, backoff=0)
def ship(order_id):
    _ran("ship", order_id)
    raise RuntimeError("no courier will take it")


@task(max_attempts=3, backoff=0)
def release_stock(order_id, sku, seconds=0.0, *, step_result):
    assert step_result == {"reservation": f"R-{order_id}-{sku}"}, step_result
    _effect("release", order_id)


@task(max_attempts=3, backoff=0)
def refund_card(order_id, amount, pause_refund=False, *, step_result):
    """With ``pause_refund``: refunds, then waits for ``resume:<order>`` (a test kills it there)."""
    assert step_result == {"charge": f"C-{order_id}-{amount}"}, step_result
    _effect("refund", order_id)
    if pause_refund:
        SideEffect.objects.create(key=f"refund-paused:{order_id}", pid=os.getpid())
        _wait_for(f"resume:{order_id}")


@task(max_attempts=2, backoff=0)
def refund_fails(order_id, amount, pause_refund=False, *, step_result):
    _ran("refund", order_id)
    raise RuntimeError("the card network refuses the refund")


def enqueue_order(order_id, *, refund=None, pause_refund=False, then=None):
    """reserve stock -> charge card -> ship -> notify; the first two can be undone."""
    from .tasks import record

    flow = Workflow(name=f"order {order_id}")
    flow.add("reserve", reserve_stock, order_id, "sku-1", compensate_with=release_stock)
    flow.add(
        "charge",
        charge_card,
        order_id,
        42,
        pause_refund=pause_refund,
        depends_on=["reserve"],
        compensate_with=refund or refund_card,
    )
    flow.add("ship", then or ship, order_id, depends_on=["charge"])
    flow.add("notify", record, f"notify:{order_id}", depends_on=["ship"])
    return flow.enqueue()


@task(max_attempts=3, backoff=0)
def hold_seat(flight, seat, seconds=0.0):
    _effect("hold", f"{flight}/{seat}")
    time.sleep(seconds)
    return {"hold": f"{flight}/{seat}"}


@task(max_attempts=3, backoff=0)
def free_seat(flight, seat, seconds=0.0, *, step_result):
    assert step_result == {"hold": f"{flight}/{seat}"}, step_result
    _effect("free", f"{flight}/{seat}")


def enqueue_flight(flight, seats, *, seconds=0.0):
    """Seats held in parallel beside a step that fails: a fan-out saga."""
    flow = Workflow(name=f"flight {flight}")
    for seat in range(seats):
        flow.add(f"seat {seat}", hold_seat, flight, seat, seconds, compensate_with=free_seat)
    flow.add("ship", ship, flight)
    return flow.enqueue()


@task(max_attempts=1)
def ship_when_courier(order_id):
    """Fails until the test says a courier came (``courier:<order>``)."""
    _ran("ship", order_id)
    if not SideEffect.objects.filter(key=f"courier:{order_id}").exists():
        raise RuntimeError("no courier yet")
    return {"parcel": f"P-{order_id}"}


@task(max_attempts=3, backoff=0)
def recall_shipment(order_id, *, step_result):
    assert step_result == {"parcel": f"P-{order_id}"}, step_result
    _effect("recall", order_id)


@task(max_attempts=3, backoff=0)
def book_room(hotel, room):
    _effect("book", f"{hotel}/{room}")
    return {"booking": f"{hotel}/{room}"}


@task(singleton=True, max_attempts=3, backoff=0)
def cancel_room_alone(hotel, room, *, step_result):
    """Singleton: writes ``alone-start`` and ``alone-end`` around a pause, so overlap shows."""
    SideEffect.objects.create(key=f"alone-start:{hotel}/{room}", pid=os.getpid())
    time.sleep(0.3)
    SideEffect.objects.create(key=f"alone-end:{hotel}/{room}", pid=os.getpid())


@task(limit=ConcurrencyLimit(1, key="hotel:{hotel}"), max_attempts=3, backoff=0)
def cancel_room_per_hotel(hotel, room, *, step_result):
    _effect("cancel", f"{hotel}/{room}")


@task(max_attempts=3, backoff=0)
def cancel_room(hotel, room, *, step_result):
    _effect("cancel", f"{hotel}/{room}")


@task(limit=ConcurrencyLimit(1, key="hotel:{chain}"), max_attempts=3, backoff=0)
def cancel_room_bad_key(hotel, room, *, step_result):
    """Its key names no argument: computed at its enqueue, it cannot be."""
    _effect("cancel", f"{hotel}/{room}")


def enqueue_stay(hotel, room, undo):
    """A room booked, then a step that fails: the booking is undone by ``undo``."""
    flow = Workflow(name=f"stay {hotel}/{room}")
    flow.add("book", book_room, hotel, room, compensate_with=undo)
    flow.add("ship", ship, f"{hotel}/{room}", depends_on=["book"])
    return flow.enqueue()
