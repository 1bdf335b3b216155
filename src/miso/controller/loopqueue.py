"""What the scheduling loop takes from its queue together with the item it just took: the
submissions waiting there (one arrival batch) or the events and progress reports waiting
behind it (one event group). The loop thread is the queue's only consumer, so it may take
items from the middle under the queue's own mutex; the items it leaves keep their order.
"""

from __future__ import annotations

import queue
from typing import Any

from miso.sched.driver import batchable

#: At most this many submissions waiting in the queue are taken as one batch (one placement
#: pass: :meth:`~miso.controller.loop.EventLoop._arrivals`).
ARRIVAL_BATCH = 128

#: Queue items taken together with the others of their kinds waiting behind them (at most
#: :data:`GROUP_MAX`), as one group of driver steps whose placement pass runs once at the end
#: (:meth:`~miso.controller.loop.EventLoop._group`).
GROUPED = ("event", "progress")
GROUP_MAX = 1024

Item = tuple[Any, ...]


def is_arrival(it: Item) -> bool:
    """A submission that may join an arrival batch (:func:`~miso.sched.driver.batchable`)."""
    return it[0] == "event" and batchable(it[1])


def waiting_arrivals(q: queue.Queue[Item]) -> list[Item]:
    """The submissions waiting in ``q`` (up to :data:`ARRIVAL_BATCH` - 1, beside the one just
    taken), taken from it ahead of the other items waiting there, which keep their order:
    they arrived while the last item was handled, and are handled as if they had arrived with
    the one just taken (a submission is the first event of its job: no item of that job
    waits before it)."""
    with q.mutex:  # the loop thread is the queue's only consumer
        if not any(is_arrival(it) for it in q.queue):
            return []
        out: list[Item] = []
        rest: list[Item] = []
        for it in q.queue:
            if len(out) < ARRIVAL_BATCH - 1 and is_arrival(it):
                out.append(it)
            else:
                rest.append(it)
        q.queue.clear()
        q.queue.extend(rest)
        q.not_full.notify_all()
    return out


def waiting_group(q: queue.Queue[Item]) -> list[Item]:
    """The events and progress reports waiting in ``q`` behind the one just taken, in their
    order, up to the first item of another kind (a cancel, a lost node, a timer's stop: they
    keep their place after the events before them), passing over the submissions
    :func:`waiting_arrivals` takes (a submission is its job's first event, so no event taken
    here belongs to a job submitted after it)."""
    with q.mutex:  # the loop thread is the queue's only consumer
        out: list[Item] = []
        rest: list[Item] = []
        items = list(q.queue)
        for k, it in enumerate(items):
            if it[0] not in GROUPED or len(out) >= GROUP_MAX - 1:
                rest.extend(items[k:])
                break
            if is_arrival(it):
                rest.append(it)
            else:
                out.append(it)
        if out:
            q.queue.clear()
            q.queue.extend(rest)
            q.not_full.notify_all()
    return out
