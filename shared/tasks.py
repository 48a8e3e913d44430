"""Celery task payloads (typed, JSON on the wire) and the message envelope.

The gateway never imports the workers: it builds a Celery protocol-2 message for a task *name*
and LPUSHes it with an asynchronous Redis client. `apply_async` would block the event loop for a
Redis round trip inside kombu on every chat; this is the same message, sent without
blocking. The integration tests prove a real Celery worker runs it.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from shared.protocol import Message, dumps
from shared.tags import Tags

# A payload that does not validate is logged by whoever reads it (Celery, the chat consumer):
# its error must not quote the values, which hold prompt and answer text.
_PAYLOAD = ConfigDict(frozen=True, hide_input_in_errors=True)


class ChatJob(BaseModel):
    """Everything a chat worker needs; travels as the `job` kwarg of the chat task."""

    model_config = _PAYLOAD

    job_id: str
    chat_id: str
    tenant_id: str
    key_id: str
    messages: list[Message]
    model: str | None = None
    max_tokens: int
    temperature: float | None = None
    cache: bool = True
    conversation_id: str | None = None
    new_conversation: bool = False  # the gateway minted conversation_id for this chat
    user: str | None = None  # the client's end user and labels, for the usage row only
    tags: Tags | None = None
    door: str | None = None  # the door it came in by (websocket, openai, responses): for the row
    # The tenant's limits as the gateway enforced them (0: none): the chat worker charges the
    # cache's background verification of this chat's answer to the tenant's window with them
    # (workers/cache/charge.py). None from an older gateway: the worker's defaults apply.
    tenant_rpm: int | None = None
    tenant_tpm: int | None = None
    received_at: float
    enqueued_at: float
    deadline_at: float  # unix seconds; a worker that finds the job later drops it
    # W3C trace context of the gateway's admission span (shared/tracing/): set only while
    # the gateway traces; the worker's spans continue it.
    traceparent: str | None = None
    tracestate: str | None = None


class DraftJob(BaseModel):
    """A draft to prefill (issue 34); travels as the `draft` kwarg of the prefill task.

    `messages` are the chat's as the chat frame would send them, the typed text last;
    `scope` names the conversation the draft belongs to (shared/drafts.py): only its newest
    draft is prefilled."""

    model_config = _PAYLOAD

    job_id: str
    draft_id: str
    scope: str
    tenant_id: str
    key_id: str
    messages: list[Message]
    model: str | None = None
    conversation_id: str | None = None
    enqueued_at: float


class VerifyJob(BaseModel):
    """A semantic hit (or near miss) to check against the engine (issue 45); travels as the
    `check` kwarg of the cache-verify task, from a chat worker to a bulk worker.

    ``fresh`` is the engine's own answer where the chat has it already (a near miss: the
    lookup fell just under the threshold and the engine answered); else the bulk worker asks
    the engine again."""

    model_config = _PAYLOAD

    chat: ChatJob  # the chat whose lookup it was: tenant, key, limits, the question
    model: str  # the model the chat was answered for
    question: str
    score: float  # the lookup's score, as the threshold compared it
    entry_id: str
    cached_answer: str
    cached_model: str
    near: bool = False
    fresh: str | None = None
    sampled_at: float


class UsageRecord(BaseModel):
    """One row of `usage_events`; idempotent on request_id."""

    model_config = ConfigDict(hide_input_in_errors=True)

    request_id: str
    tenant_id: str
    key_id: str
    model: str
    route: str = "default"
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str
    status: str  # ok | error | cancelled | timeout
    created_at: float
    # Issue 32: NULL where unknown (rows of older workers, a model without prices).
    cost: float | None = None
    end_user: str | None = None
    tags: Tags | None = None
    conversation_id: str | None = None
    cache_tier: str | None = None  # exact | semantic | miss | off
    cached_prompt_tokens: int | None = None  # the engine's prefix-cache hits, where reported
    # Issue 34: a draft's prefill (route "prefill"): the prompt tokens it had the engine
    # process; NULL on every other row.
    prefill_tokens: int | None = None
    # Issue 44: the door the chat came in by (websocket, openai, responses); NULL on older rows
    # and on a draft's prefill.
    door: str | None = None


class MessagesRecord(BaseModel):
    """The turn's text, written only when `store_text` is on; idempotent on request_id."""

    model_config = ConfigDict(hide_input_in_errors=True)

    request_id: str
    tenant_id: str
    conversation_id: str | None = None
    messages: list[Message]
    answer: str
    model: str
    created_at: float


def new_id() -> str:
    return uuid.uuid4().hex


def task_message(
    task_name: str,
    kwargs: dict[str, Any],
    *,
    queue: str,
    task_id: str | None = None,
    origin: str = "firsttoken",
    expires_iso: str | None = None,
) -> str:
    """A kombu Redis-transport envelope holding a Celery protocol-2 task message, as JSON."""
    task_id = task_id or new_id()
    headers = {
        "lang": "py",
        "task": task_name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": expires_iso,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": "{...}",  # payloads may hold prompt text: never in logs
        "origin": origin,
        "ignore_result": True,
    }
    body = [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    envelope = {
        # No body_encoding: kombu hands a plain JSON body to the JSON decoder as is.
        "body": dumps(body),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "delivery_tag": new_id(),
        },
    }
    return dumps(envelope)


class TaskCall(BaseModel):
    """One Celery protocol-2 task message, as a consumer reads it off a kombu Redis list."""

    model_config = _PAYLOAD

    name: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]


def parse_task_message(raw: bytes | str) -> TaskCall:
    """Read a kombu Redis-transport envelope (as `task_message` or Celery's own producer
    writes it: plain or base64 body, JSON content) into the task it calls.

    Raises ValueError saying what is wrong with a message that is not such a task call.
    """
    try:
        envelope = orjson.loads(raw)
        headers = envelope["headers"]
        body: Any = envelope["body"]
        if envelope.get("content-type", "application/json") != "application/json":
            raise ValueError(
                f"content-type {envelope.get('content-type')!r} (only JSON is accepted)"
            )
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = orjson.loads(body)
        return TaskCall(name=headers["task"], task_id=headers["id"], args=args, kwargs=kwargs)
    except ValueError as exc:
        raise ValueError(f"not a Celery protocol-2 JSON task message: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a Celery protocol-2 JSON task message: missing {exc}") from exc
