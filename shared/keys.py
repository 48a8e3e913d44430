"""Every Redis key, pub/sub channel and Celery queue name, built from one prefix."""

from __future__ import annotations

from dataclasses import dataclass

# Logical queue names; operators say `firsttoken worker --queues chat`.
CHAT_QUEUE = "chat"
BULK_QUEUE = "bulk"
SUMMARIZE_QUEUE = "summarize"  # low priority: conversation summaries, off the hot path
QUEUES = (CHAT_QUEUE, BULK_QUEUE, SUMMARIZE_QUEUE)

# Task names: the gateway enqueues by name and never imports the workers.
CHAT_TASK = "firsttoken.chat"
PERSIST_USAGE_TASK = "firsttoken.persist_usage"
PERSIST_USAGE_BATCH_TASK = "firsttoken.persist_usage_batch"
PERSIST_MESSAGES_TASK = "firsttoken.persist_messages"
SUMMARIZE_TASK = "firsttoken.summarize"
# A draft's prefill (issue 34): on the chat queue's lowest-priority list, read by the chat pool
# only when no chat waits (workers/chat/prefill.py).
PREFILL_TASK = "firsttoken.prefill"
# A sample of the semantic cache's hits checked against the engine (issue 45): on the bulk
# queue's lowest-priority list, read by a bulk worker after every durable write waiting.
CACHE_VERIFY_TASK = "firsttoken.cache_verify"
# kombu's Redis transport keeps a queue's priority p > 0 messages in QUEUE + this + p, and reads
# them after those of every higher priority (kombu.transport.redis Channel.sep, PRIORITY_STEPS).
KOMBU_PRIORITY_SEP = "\x06\x16"
LOWEST_PRIORITY = 9


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "ft"

    # --- Celery (kombu's Redis transport prefixes its own keys with this) ---------------
    @property
    def celery_keyprefix(self) -> str:
        return f"{self.prefix}:celery:"

    def queue_list(self, queue: str) -> str:
        """The Redis list kombu reads a queue from (priority 0)."""
        return f"{self.celery_keyprefix}{queue}"

    def verify_list(self) -> str:
        """The bulk queue's lowest-priority list: cache verifications wait behind the writes."""
        return f"{self.queue_list(BULK_QUEUE)}{KOMBU_PRIORITY_SEP}{LOWEST_PRIORITY}"

    def draft_list(self) -> str:
        """The chat queue's lowest-priority list: drafts wait here behind every chat."""
        return f"{self.queue_list(CHAT_QUEUE)}{KOMBU_PRIORITY_SEP}{LOWEST_PRIORITY}"

    # --- drafts (issue 34) --------------------------------------------------------------
    def draft_latest(self, scope: str) -> str:
        """String: the job id of a conversation's newest draft; a worker drops any other."""
        return f"{self.prefix}:draft:latest:{scope}"

    def draft_running(self, scope: str) -> str:
        """String: the job id of the draft being prefilled for a conversation; a newer draft's
        admission publishes it on the cancel channel (the prefill is aborted)."""
        return f"{self.prefix}:draft:running:{scope}"

    def draft_rate(self, key_id: str) -> str:
        """Counter of an API key's drafts in the current one-second window."""
        return f"{self.prefix}:draft:rate:{key_id}"

    # --- one chat job -------------------------------------------------------------------
    def job_channel(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def replay_stream(self, job_id: str) -> str:
        return f"{self.prefix}:replay:{job_id}"

    def cancel_flag(self, job_id: str) -> str:
        return f"{self.prefix}:cancel:{job_id}"

    def job_owner(self, job_id: str) -> str:
        """Which API key started the job: resume is allowed only for the same key."""
        return f"{self.prefix}:owner:{job_id}"

    def job_followers(self, job_id: str) -> str:
        """Set: the gateway processes following a job (the one that admitted it, and any that
        resumed it), so one giving the job up does not cancel it under the others."""
        return f"{self.prefix}:followers:{job_id}"

    def worker_jobs(self, worker: str) -> str:
        """Hash: job id -> the ChatJob payload, for every chat a chat worker runs now: its
        owner lease (the worker's heartbeat in `worker_heartbeats` is the lease's renewal),
        from which another worker takes the chat over when the owner dies
        (workers/chat/failover.py)."""
        return f"{self.prefix}:jobs:{worker}"

    def job_taken(self, job_id: str) -> str:
        """String: the worker that took a job over from a dead one. A worker that finds its
        lease of the job gone stands down only when this names another worker (else its
        lease was lost with Redis's data, and it writes it again)."""
        return f"{self.prefix}:taken:{job_id}"

    @property
    def cancel_channel(self) -> str:
        """Workers subscribe here; each message is a job id to stop."""
        return f"{self.prefix}:cancel"

    @property
    def tenant_changed_channel(self) -> str:
        """Workers subscribe here; each message is a tenant id whose rarely changing rows (its
        knowledge base, its prompt) just changed, so workers read them again at once."""
        return f"{self.prefix}:tenant-changed"

    # --- auth and liveness --------------------------------------------------------------
    def api_key(self, key_hash: str) -> str:
        return f"{self.prefix}:apikey:{key_hash}"

    def worker_heartbeats(self, queue: str) -> str:
        """Sorted set: worker name -> last heartbeat (unix seconds)."""
        return f"{self.prefix}:workers:{queue}"

    def worker_starting(self, queue: str) -> str:
        """Sorted set: worker name -> when it started (unix seconds), from its process start
        until its first heartbeat (a chat worker beats only once warm): a gateway does not end
        a queued chat for want of a worker while one is on its way (shared/failover.py)."""
        return f"{self.prefix}:workers-starting:{queue}"

    def worker_status(self, worker: str) -> str:
        """String (JSON, workers/workerstatus.py): a worker process's host, pid, queues and load
        as of its last heartbeat, written by that beat; expires `worker_status_ttl_s` after it,
        so a dead worker shows as stale in `firsttoken workers` for a while, then goes."""
        return f"{self.prefix}:worker:{worker}"

    @property
    def worker_statuses(self) -> str:
        """Sorted set: worker name -> last heartbeat (unix s) of every `worker_status` record,
        the index `firsttoken workers` reads (a lost chat worker leaves `worker_heartbeats` once
        its chats are taken over, but is still shown here); trimmed by each beat."""
        return f"{self.prefix}:workerindex"

    @property
    def gateways(self) -> str:
        """Sorted set: gateway process name -> last heartbeat (Redis time, ms); a chat worker
        aborts the chats no live gateway follows (workers/chat/orphans.py)."""
        return f"{self.prefix}:gateways"

    # --- the usage outbox: rows not yet written (shared/usage_outbox.py) ------------------
    @property
    def usage_rows(self) -> str:
        """Hash: request_id -> a usage row (JSON) no bulk worker has written yet."""
        return f"{self.prefix}:usage:rows"

    @property
    def usage_due(self) -> str:
        """Sorted set: request_id -> when (Redis time, ms) a sweep sends its row (again) if it
        is still unwritten."""
        return f"{self.prefix}:usage:due"

    # --- keys, rate limits (issue 6) ------------------------------------------------------
    def rate_window(self, scope: str, subject_id: str) -> str:
        """Sorted set: request id -> admission time (ms) in the sliding window of a key/tenant."""
        return f"{self.prefix}:rl:{scope}:{subject_id}:w"

    def rate_tokens(self, scope: str, subject_id: str) -> str:
        """Hash: request id -> tokens charged, plus the field "=sum" holding their total."""
        return f"{self.prefix}:rl:{scope}:{subject_id}:t"

    def key_streams(self, key_id: str) -> str:
        """Sorted set: job id -> lease expiry (ms); a crashed gateway's slots expire with it."""
        return f"{self.prefix}:streams:{key_id}"

    def key_revoked(self, key_id: str) -> str:
        """Present once a key is revoked; the admission script refuses the key while it exists."""
        return f"{self.prefix}:revoked:{key_id}"

    def admission_keys(self, key_id: str, tenant_id: str) -> list[str]:
        """The keys shared/redis/scripts/rate_admit.lua reads, in its order: the key's and the
        tenant's windows and token hashes, the key's stream slots, its revocation mark."""
        return [
            self.rate_window("key", key_id),
            self.rate_tokens("key", key_id),
            self.rate_window("tenant", tenant_id),
            self.rate_tokens("tenant", tenant_id),
            self.key_streams(key_id),
            self.key_revoked(key_id),
        ]

    @property
    def key_events(self) -> str:
        """Pub/sub: "revoked <key_hash> <key_id>"; every gateway drops the key and its sockets."""
        return f"{self.prefix}:keyevents"

    # --- conversations (issue 5) ---------------------------------------------------------
    def summary_lock(self, conversation_id: str) -> str:
        """String: set while a summary job for the conversation is queued or running."""
        return f"{self.prefix}:summary:{conversation_id}"

    # --- stored responses (issue 44, the Responses API door) ----------------------------
    def response(self, response_id: str) -> str:
        """String (JSON): a stored response, its tenant and its conversation
        (gateway/responses.py); expires FIRSTTOKEN_RESPONSES_TTL_S after it was written."""
        return f"{self.prefix}:response:{response_id}"

    def response_head(self, conversation_id: str) -> str:
        """String: the id of a conversation's latest response, the only one that can be
        continued (the conversation is one line of turns, not a tree)."""
        return f"{self.prefix}:response:head:{conversation_id}"

    # --- semantic cache (issue 4) -------------------------------------------------------
    def cache_entry(self, entry_id: str) -> str:
        """Hash: one cached answer (question, context, vectors, answer, usage); expires by TTL."""
        return f"{self.prefix}:cache:e:{entry_id}"

    def cache_exact(self, tenant_id: str, exact_hash: str) -> str:
        """String: entry id of the exact request hash; expires with the entry."""
        return f"{self.prefix}:cache:x:{tenant_id}:{exact_hash}"

    def cache_lru(self, tenant_id: str) -> str:
        """Sorted set: entry id -> last use (unix s); the per-tenant cap evicts the lowest."""
        return f"{self.prefix}:cache:lru:{tenant_id}"

    @property
    def cache_tenants(self) -> str:
        """Set of tenant ids that have cache entries (a restarted worker rebuilds from these)."""
        return f"{self.prefix}:cache:tenants"

    @property
    def cache_events(self) -> str:
        """Stream of added/removed entries that every chat worker process follows."""
        return f"{self.prefix}:cache:events"

    def cache_verdicts(self, tenant_id: str) -> str:
        """Hash: score bucket -> verified / disagreed counts of the tenant's verified lookups
        (fields `n:<bucket>`, `d:<bucket>`; workers/cache/online.py)."""
        return f"{self.prefix}:cache:verdicts:{tenant_id}"

    def cache_stats(self, tenant_id: str) -> str:
        """Hash: the tenant's cache counters (lookups by tier, verified, disagreed) and the
        threshold in force with its estimate, for `firsttoken cache report`."""
        return f"{self.prefix}:cache:stats:{tenant_id}"

    @property
    def cache_stats_tenants(self) -> str:
        """Set of tenant ids with cache counters."""
        return f"{self.prefix}:cache:stats:tenants"
