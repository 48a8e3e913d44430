"""Metrics of chats: Prometheus series and, with an OTLP endpoint, OpenTelemetry's GenAI ones.

Several processes per host (gateway processes sharing a port, chat workers) are one target:
prometheus_client's multiprocess mode (`FIRSTTOKEN_METRICS_DIR`). Every process writes its
series to memory-mapped files in that directory and any gateway's `GET /metrics` merges them,
so a scrape that reaches an arbitrary process (`--reuse-port`) still shows the whole host.

- `series.py`: the Prometheus series (names, labels, buckets), defined once;
- `values.py`: the pure part, what one chat's timing points and ending observe;
- `multiproc.py`: the directory, the process identifier, the exposition and dead processes;
- `recorder.py`: the process's recorder, the few calls the hot path makes;
- `otel.py`: the GenAI instruments, imported only when an OTLP endpoint is configured.
"""

from shared.metrics.recorder import recorder, start_process, stop_process

__all__ = ["recorder", "start_process", "stop_process"]
