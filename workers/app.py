"""The Celery app: queues `chat` (interactive) and `bulk` (durable writes).

Start a pool per queue: `firsttoken worker --queues chat` (threads pool, many chats per process)
and `firsttoken worker --queues bulk`.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_shutdown
from kombu.entity import Exchange, Queue

from shared.keys import (
    BULK_QUEUE,
    CHAT_QUEUE,
    CHAT_TASK,
    PERSIST_MESSAGES_TASK,
    PERSIST_USAGE_BATCH_TASK,
    PERSIST_USAGE_TASK,
    SUMMARIZE_QUEUE,
    SUMMARIZE_TASK,
    Keys,
)
from shared.redis.address import celery_broker_url
from shared.settings import get_settings

settings = get_settings()
SHUTDOWN_GRACE_S = 30.0
keys = Keys(settings.redis_prefix)

app = Celery(
    "firsttoken",
    broker=celery_broker_url(settings.redis_url),
    include=["workers.chat", "workers.persist", "workers.summarize"],
)
app.conf.update(
    broker_transport_options={
        "global_keyprefix": keys.celery_keyprefix,
        # Bulk tasks ack late: an unacked message comes back after this if its worker died.
        "visibility_timeout": 600,
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
        SUMMARIZE_TASK: {"queue": SUMMARIZE_QUEUE},
    },
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    task_send_sent_event=False,
)


# Celery connects signal handlers by weak reference: these must be module-level functions.
@worker_init.connect
def _start_loop(sender: Any = None, **_: Any) -> None:
    from workers.context import configure, get_context
    from workers.runtime import runner

    queues = tuple(sorted(app.amqp.queues.consume_from or app.amqp.queues))
    # A chat worker's heartbeat waits for its warm-up (workers/chat.py, _warm_on_start).
    configure(
        getattr(sender, "hostname", None) or "worker",
        queues,
        announce_at_start=CHAT_QUEUE not in queues,
    )
    # Start the loop, Redis pool, cancel listener (and heartbeat) before the first task.
    runner.run(get_context())


@worker_shutdown.connect
def _stop_loop(**_: Any) -> None:
    from workers.context import close_context
    from workers.runtime import runner

    # Warm shutdown: chats already streaming get a grace period to finish.
    runner.drain(timeout=SHUTDOWN_GRACE_S)
    runner.stop(close_context())
