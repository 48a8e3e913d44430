"""The process's recorder: the few calls the chat path makes, each a no-op while metrics are
off (`FIRSTTOKEN_METRICS=off`, or a worker with no directory to write to).

Who observes what, from measurements already taken (shared/metrics/values.py):
- the worker, as a chat ends (workers/chat/record.py, beside its usage row): queue wait, tokens,
  the ending's status, engine errors, time per output token;
- the worker's cache stage, per lookup: its result;
- the worker's chat pool: chats in flight and capacity;
- the gateway, as it relays a `done` (gateway/jobs.py): time to first token and the stages
  of `done.timings`, the same numbers the client reads there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from shared.errors import ConfigError
from shared.metrics import multiproc
from shared.metrics.series import Series, queue_depth
from shared.metrics.values import (
    Ending,
    cache_result,
    engine_error_kind,
    seconds,
    time_per_output_token,
)
from shared.otlp import otlp_endpoint

if TYPE_CHECKING:
    from shared.metrics.otel import GenAIMetrics
    from shared.settings import Settings
    from shared.tasks import ChatJob

log = logging.getLogger(__name__)


class _Sources:
    """Several collectors read as one registry by generate_latest."""

    def __init__(self, sources: Iterable[Any]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterable[Any]:
        for source in self.sources:
            yield from source.collect()


class _Family:
    def __init__(self, family: Any) -> None:
        self.family = family

    def collect(self) -> Iterable[Any]:
        return [self.family]


class Recorder:
    def __init__(self) -> None:
        self.started = False
        self.series: Series | None = None
        self.otel: GenAIMetrics | None = None
        self.directory: str | None = None  # multiprocess mode's
        self.registry: CollectorRegistry | None = None  # single-process mode's

    @property
    def on(self) -> bool:
        return self.series is not None or self.otel is not None

    # --- the chat path ----------------------------------------------------------------
    def chat_ended(
        self, job: ChatJob, points: Mapping[str, float], outcome: Ending, now: float
    ) -> None:
        """A worker ended a chat, however it ended (workers/chat/record.py)."""
        series = self.series
        if series is not None:
            start = points.get("worker_start")
            if start is not None:
                series.chat_queue_wait.observe(max(0.0, start - job.enqueued_at))
            series.chats_of(outcome.status).inc()
            if outcome.prompt_tokens:
                series.prompt_tokens.inc(outcome.prompt_tokens)
            if outcome.completion_tokens:
                series.completion_tokens.inc(outcome.completion_tokens)
            if outcome.status != "ok":
                kind = engine_error_kind(outcome.status, outcome.finish_reason, points)
                if kind is not None:
                    series.engine_errors.labels(outcome.model, kind).inc()
            else:
                tpot = time_per_output_token(
                    points, outcome.completion_tokens, status="ok", cached=outcome.cached
                )
                if tpot is not None:
                    series.tpot.observe(tpot)
        if self.otel is not None:
            self.otel.chat_ended(job, points, outcome, now)

    def chat_done(self, timings: Mapping[str, float], model: str, cached: bool) -> None:
        """The gateway relayed a chat's `done` with these stage timings (ms)."""
        series = self.series
        if series is not None:
            ttft = seconds(timings.get("ttft_ms"))
            if ttft is not None:
                series.ttft_of(model, cached).observe(ttft)
            stages = series.stages
            for name, ms in timings.items():
                child = stages.get(name)
                if child is not None:
                    child.observe(ms / 1000.0)
        if self.otel is not None:
            self.otel.chat_done(timings, model, cached)

    def models_known(self, models: Iterable[str]) -> None:
        """Make the time-to-first-token series of these models at zero before their first
        chat: rate() of a series born with counts in it misses them (it sees increases)."""
        if self.series is not None:
            for model in models:
                for cached in (False, True):
                    self.series.ttft_of(model, cached)

    def cache_lookup(self, tier: str, refused: bool) -> None:
        """One answer-cache lookup ended (workers/cache/stage.py)."""
        if self.series is not None:
            result = cache_result(tier, refused)
            if result is not None:
                self.series.lookups[result].inc()

    def cache_verification(self, agree: bool) -> None:
        """One semantic-cache verdict (workers/cache/stage.py)."""
        if self.series is not None:
            self.series.cache_verifications.labels("agree" if agree else "disagree").inc()

    def cache_wrong_rate(self, tenant: str, rate: float, upper: float) -> None:
        """A tenant's wrong-serve estimate at its threshold in force, as last refreshed."""
        if self.series is not None:
            self.series.cache_wrong_rate.labels(tenant, "point").set(rate)
            self.series.cache_wrong_rate.labels(tenant, "upper").set(upper)

    def worker_load(self, worker: str, capacity: int) -> Gauge | None:
        """A chat worker's in-flight gauge (its reader incs and decs it), its capacity set."""
        if self.series is None:
            return None
        self.series.capacity.labels(worker).set(capacity)
        gauge = self.series.in_flight.labels(worker)
        gauge.set(0)
        return gauge

    # --- exposition ---------------------------------------------------------------------
    def exposition(self, own: Iterable[Any] = (), depths: Mapping[str, int] | None = None) -> bytes:
        """The text format of a scrape: in multiprocess mode every process of the directory,
        else this process (`own`: its other registries) and its series; then the queue
        depths read for this scrape."""
        if self.directory is not None:
            multiproc.sweep_dead(self.directory)
            sources: list[Any] = [multiproc.collected(self.directory)]
        else:
            sources = list(own)
            if self.registry is not None:
                sources.append(self.registry)
        if depths is not None:
            sources.append(_Family(queue_depth(depths)))
        return generate_latest(_Sources(sources))


recorder = Recorder()


def start_process(settings: Settings, role: str) -> Recorder:
    """Set this process's metrics up once, before any of its series is made (role: gateway
    or worker). In multiprocess mode the directory must exist or be creatable."""
    if recorder.started:
        return recorder
    recorder.started = True
    if settings.metrics == "off":
        return recorder
    directory = settings.metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        multiproc.enable(directory)
        recorder.directory = directory
        recorder.series = Series(None)
    elif role == "gateway":
        recorder.registry = CollectorRegistry()
        recorder.series = Series(recorder.registry)
    # A worker with no directory: nobody could read its series, so it keeps none.
    if recorder.series is not None:
        recorder.series.process.labels(role).set(1)
    if otlp_configured(settings):
        try:
            from shared.metrics import otel  # the SDK is loaded only here
        except ImportError as exc:
            raise ConfigError(
                "OTLP metrics are configured (FIRSTTOKEN_METRICS_OTLP_ENDPOINT or "
                f"OTEL_EXPORTER_OTLP_ENDPOINT) but the SDK is missing ({exc}); install the "
                "otel extra: pip install 'firsttoken[otel]'"
            ) from exc
        recorder.otel = otel.GenAIMetrics(otel.exporting_reader(settings), role)
    return recorder


def otlp_configured(settings: Settings) -> bool:
    """Whether OTLP metrics are on (shared/otlp.py): FIRSTTOKEN_METRICS_OTLP_ENDPOINT, or the
    SDK's own OTEL_EXPORTER_OTLP_METRICS_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, unless
    OTEL_SDK_DISABLED or OTEL_METRICS_EXPORTER=none says no."""
    return otlp_endpoint("metrics", settings.metrics_otlp_endpoint, os.environ) is not None


def stop_process() -> None:
    """This process is going away: its live gauges stop counting, OTLP sends what is left."""
    if recorder.directory is not None:
        multiproc.mark_dead(recorder.directory)
    if recorder.otel is not None:
        recorder.otel.flush()
