"""The Celery app: queues `chat` (interactive), `bulk` (durable writes) and `summarize`.

Start a pool per queue, each a Celery worker: `celery -A workers.app worker -Q chat` (what
`firsttoken worker --queues chat` runs; the chat queue is read on the process loop by
workers/chat/pool.py's bootstep, many chats per process), `-Q bulk` and `-Q summarize`.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.amqp import AMQP
from celery.signals import worker_init, worker_shutdown
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer

from shared.keys import (
    BULK_QUEUE,
    CACHE_VERIFY_TASK,
    CHAT_QUEUE,
    CHAT_TASK,
    PERSIST_MESSAGES_TASK,
    PERSIST_USAGE_BATCH_TASK,
    PERSIST_USAGE_TASK,
    SUMMARIZE_QUEUE,
    SUMMARIZE_TASK,
    Keys,
)
from shared.metrics import start_process, stop_process
from shared.redis.address import celery_broker_url, celery_transport_options
from shared.settings import get_settings

settings = get_settings()
# Warm shutdown: how long work already on the process loop gets to finish.
SHUTDOWN_GRACE_S = 30.0
keys = Keys(settings.redis_prefix)
# Queues whose messages no kombu consumer reads: workers/chat/pool.py reads them on the loop.
READ_ON_THE_LOOP = frozenset({CHAT_QUEUE})


class TaskConsumer(Consumer):
    """kombu's task consumer, less the reads of READ_ON_THE_LOOP's queues.

    Such a queue stays in the consumer's queue list (so `celery inspect active_queues` names
    it), but kombu never reads its Redis lists: one reader per queue, and a chat never crosses
    kombu's thread. (`control cancel_consumer chat` takes it off that list but does not stop the
    chat pool's reader: `control shutdown` stops a chat worker.) `_basic_consume` is
    the one method through which kombu starts reading a queue (tests/integration/
    test_chatpool.py fails if a kombu upgrade changes that)."""

    def _basic_consume(self, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        if queue.name in READ_ON_THE_LOOP:
            return None
        return super()._basic_consume(queue, *args, **kwargs)


class TaskAMQP(AMQP):  # type: ignore[misc]  # celery ships no annotations
    Consumer = TaskConsumer


app = Celery(
    "firsttoken",
    broker=celery_broker_url(settings.redis_url),
    include=[
        "workers.chat.run",
        "workers.bulk.persist",
        "workers.bulk.verify",
        "workers.summarize",
    ],
    amqp=TaskAMQP,
)
app.conf.update(
    broker_transport_options={
        "global_keyprefix": keys.celery_keyprefix,
        # Bulk tasks ack late: an unacked message comes back after this if its worker died.
        # kombu sweeps for such messages every `unacked_restore_interval` x `_throttle` s
        # (10 x 10 by default): every 5 s here, so a dead bulk worker's tasks run again within
        # about visibility_timeout + 5 s (issue 29: within 60 s). A task still waiting out a
        # retry countdown longer than this is delivered twice: harmless (writes are idempotent
        # on request_id), and the backoff cap (persist_retry_backoff_max_s) is kept below it.
        "visibility_timeout": settings.bulk_visibility_timeout_s,
        "unacked_restore_interval": 5,
        "unacked_restore_throttle": 1,
        # A sentinel:// URL: kombu's sentinel transport, told the master's name here.
        **celery_transport_options(settings.redis_url),
    },
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    result_backend=None,
    task_ignore_result=True,
    # One direct exchange per queue, so a retry re-published by Celery lands on its own queue.
    task_queues=[
        Queue(CHAT_QUEUE, Exchange(CHAT_QUEUE), routing_key=CHAT_QUEUE),
        Queue(BULK_QUEUE, Exchange(BULK_QUEUE), routing_key=BULK_QUEUE),
        Queue(SUMMARIZE_QUEUE, Exchange(SUMMARIZE_QUEUE), routing_key=SUMMARIZE_QUEUE),
    ],
    task_default_queue=CHAT_QUEUE,
    task_routes={
        CHAT_TASK: {"queue": CHAT_QUEUE},
        PERSIST_USAGE_TASK: {"queue": BULK_QUEUE},
        PERSIST_USAGE_BATCH_TASK: {"queue": BULK_QUEUE},
        PERSIST_MESSAGES_TASK: {"queue": BULK_QUEUE},
        CACHE_VERIFY_TASK: {"queue": BULK_QUEUE},
        SUMMARIZE_TASK: {"queue": SUMMARIZE_QUEUE},
    },
    # Never prefork: each process has its one loop (workers/runtime.py), started at worker_init,
    # which a forked child would not have. Threads start only when kombu hands the pool a
    # task, so a chat worker (whose chats never pass through the pool) has none of them.
    worker_pool="threads",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    task_send_sent_event=False,
)


# The chat pool (workers/chat/pool.py): included only in a worker that consumes the chat queue.
app.steps["worker"].add("workers.chat.pool:ChatPool")
app.steps["consumer"].add("workers.chat.pool:ChatTaskEvents")


# Celery connects signal handlers by weak reference: these must be module-level functions.
@worker_init.connect
def _start_process(sender: Any = None, **_: Any) -> None:
    """Before any task or bootstep: the loop, Redis, the cancel listener (workers/lifecycle.py)."""
    from shared.logs import hold_content_loggers
    from workers.chat.load import celery_pool_probe
    from workers.lifecycle import lifecycle

    # Before the pool exists: it decides once, at its start, whether to log task bodies.
    hold_content_loggers()

    # Before any series of this process is made (shared/metrics/: multiprocess mode).
    start_process(get_settings(), "worker")
    queues = tuple(sorted(app.amqp.queues.consume_from or app.amqp.queues))
    probe = celery_pool_probe(sender) if sender is not None else None
    lifecycle.start(getattr(sender, "hostname", None) or "worker", queues, probe)


@worker_shutdown.connect
def _stop_process(**_: Any) -> None:
    """After the pool has stopped (and the chat pool drained): close in reverse order."""
    from workers.lifecycle import lifecycle

    lifecycle.stop(grace_s=SHUTDOWN_GRACE_S)
    stop_process()
