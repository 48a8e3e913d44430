"""Every Prometheus series firsttoken exports besides the gateway's own five
(gateway/metrics.py), defined once. docs/operations.md ("Metrics") lists them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

# Seconds. Fine below 50 ms, so "did the p50 move by 5 ms?" has an answer at 5-30 ms, and
# coarse above a second, where nothing interactive should be.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip

# The stages of `done.timings` (shared/timing.py STAGES) observed as `stage`, by their name there.
STAGE_OF_TIMING = {
    "accept_ms": "accept",
    "queue_ms": "queue",
    "cache_ms": "cache",
    "retrieval_ms": "retrieval",
    "engine_ttft_ms": "engine_ttft",
    "publish_ms": "publish",
    "relay_ms": "relay",
}
TOKEN_KINDS = ("prompt", "completion")
CACHE_RESULTS = ("exact_hit", "semantic_hit", "miss", "refused")


class Series:
    """The series of one process. `registry` is None in multiprocess mode (the values go to
    the directory's files, and the exposition reads them there, not from a registry)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        def histogram(name: str, doc: str, labels: Iterable[str] = ()) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=registry)

        self.ttft = histogram(
            "firsttoken_time_to_first_token_seconds",
            "From the chat frame's arrival to its first token written to the client (gateway).",
            ["model", "cached"],
        )
        self.queue_wait = histogram(
            "firsttoken_queue_wait_seconds",
            "From enqueue to a worker's pickup, of every chat a worker took (worker).",
            ["queue"],
        )
        self.stage = histogram(
            "firsttoken_stage_seconds",
            "Stages in front of the first token of answered chats (done.timings; gateway).",
            ["stage"],
        )
        self.tpot = histogram(
            "firsttoken_time_per_output_token_seconds",
            "Engine time per output token after the first, of answered uncached chats (worker).",
        )
        self.tokens = Counter(
            "firsttoken_tokens", "Tokens of ended chats (worker).", ["kind"], registry=registry
        )
        self.chats = Counter(
            "firsttoken_chats",
            "Chats ended by a worker: ok | error | cancelled | timeout.",
            ["status"],
            registry=registry,
        )
        self.cache_lookups = Counter(
            "firsttoken_cache_lookups",
            "Answer-cache lookups: exact_hit | semantic_hit | miss | refused (a candidate was "
            "close enough but a guard refused it).",
            ["result"],
            registry=registry,
        )
        self.cache_verifications = Counter(
            "firsttoken_cache_verifications",
            "Semantic-cache verdicts (issue 45): a cached answer compared with the engine's, "
            "for a sampled hit or a near miss: agree | disagree.",
            ["verdict"],
            registry=registry,
        )
        self.cache_wrong_rate = Gauge(
            "firsttoken_cache_wrong_serve_rate",
            "A tenant's estimated semantic wrong-serve rate at its threshold in force, from "
            "its verdicts: point | upper (the 95% bound held within cache_max_error_rate).",
            ["tenant", "estimate"],
            multiprocess_mode="max",
            registry=registry,
        )
        self.engine_errors = Counter(
            "firsttoken_engine_errors",
            "Chats the engine failed (kind engine_error) or did not answer in time (timeout).",
            ["model", "kind"],
            registry=registry,
        )
        # Live gauges: a process that is gone (mark_process_dead) no longer counts.
        self.in_flight = Gauge(
            "firsttoken_worker_chats_in_flight",
            "Chats a chat worker is running now.",
            ["worker"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.capacity = Gauge(
            "firsttoken_worker_capacity",
            "Chats a chat worker runs at once (FIRSTTOKEN_CHAT_CONCURRENCY).",
            ["worker"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        # One sample per live process: in multiprocess mode the merge adds each one's `pid`
        # (host-pid), so a scrape shows which processes of the host it covers.
        self.process = Gauge(
            "firsttoken_process",
            "1 for each live process writing these series, by role (gateway | worker).",
            ["role"],
            multiprocess_mode="liveall",
            registry=registry,
        )
        # Children looked up once: `.labels()` takes a lock and hashes on every call.
        self.stages = {key: self.stage.labels(stage) for key, stage in STAGE_OF_TIMING.items()}
        self.prompt_tokens, self.completion_tokens = (self.tokens.labels(k) for k in TOKEN_KINDS)
        self.chat_queue_wait = self.queue_wait.labels("chat")
        self.lookups = {result: self.cache_lookups.labels(result) for result in CACHE_RESULTS}
        self._ttft: dict[tuple[str, bool], Histogram] = {}
        self._chats: dict[str, Counter] = {}
        for status in ("ok", "error", "cancelled", "timeout"):
            self.chats_of(status)  # at zero from the start, as the children above

    def ttft_of(self, model: str, cached: bool) -> Histogram:
        child = self._ttft.get((model, cached))
        if child is None:
            child = self._ttft[(model, cached)] = self.ttft.labels(model, str(cached).lower())
        return child

    def chats_of(self, status: str) -> Counter:
        child = self._chats.get(status)
        if child is None:
            child = self._chats[status] = self.chats.labels(status)
        return child


def queue_depth(depths: Mapping[str, int]) -> GaugeMetricFamily:
    """`firsttoken_queue_depth`, read from Redis at scrape time (gateway/metrics.py): one
    value for the deployment, so no process has to keep it, live or dead."""
    family = GaugeMetricFamily(
        "firsttoken_queue_depth", "Task messages waiting in each queue.", labels=["queue"]
    )
    for queue, depth in depths.items():
        family.add_metric([queue], depth)
    return family
