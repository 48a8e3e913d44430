"""The scaling recipe and the alerts under deploy/ match the stack they are for (issue 32):
a KEDA ScaledObject for every queue the stack declares, reading the Redis list the stack really
uses and a Prometheus series the stack exports, aimed at a Deployment that runs that queue's
worker; alerts and scrape config that promtool accepts, and alerts that fire when they should
(`promtool test rules`). A renamed queue, prefix or metric breaks this test, not production."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from shared.keys import CHAT_QUEUE, QUEUES, Keys
from shared.metrics.series import Series, queue_depth
from shared.settings import Settings
from tests.support import ROOT

DEPLOY = ROOT / "deploy"


def exported_series() -> frozenset[str]:
    """The names the stack really exports (shared/metrics/series.py), as PromQL sees them."""
    registry = CollectorRegistry()
    Series(registry)
    names = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    return frozenset({*names, queue_depth({}).name})


METRICS = exported_series()
DEFAULT_KEYS = Keys(Settings.model_fields["redis_prefix"].default)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def scaled_objects() -> list[dict[str, Any]]:
    docs = [doc for path in sorted((DEPLOY / "keda").glob("*.yaml")) for doc in documents(path)]
    return [doc for doc in docs if doc["kind"] == "ScaledObject"]


def deployments() -> dict[str, dict[str, Any]]:
    docs = documents(DEPLOY / "k8s" / "workers.yaml")
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Deployment"}


def series(expr: str) -> set[str]:
    """The firsttoken series an expression reads, histogram suffixes taken off."""
    names = set(re.findall(r"\bfirsttoken_[a-z_]+", expr))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


def triggers(scaled: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [t for t in scaled["spec"]["triggers"] if t["type"] == kind]


def for_queue(queue: str) -> dict[str, Any]:
    """The one ScaledObject whose Redis trigger reads `queue`'s list."""
    found = [
        s
        for s in scaled_objects()
        if any(
            t["metadata"]["listName"] == DEFAULT_KEYS.queue_list(queue)
            for t in triggers(s, "redis")
        )
    ]
    assert len(found) == 1, f"{len(found)} ScaledObjects read {DEFAULT_KEYS.queue_list(queue)}"
    return found[0]


@pytest.mark.parametrize("queue", QUEUES)
def test_every_queue_scales_on_its_real_redis_list_and_its_queue_wait(queue: str) -> None:
    scaled = for_queue(queue)
    queries = [t["metadata"]["query"] for t in triggers(scaled, "prometheus")]
    wait = [q for q in queries if "firsttoken_queue_wait_seconds" in series(q)]
    assert wait and all(f'queue="{queue}"' in q for q in wait), queries
    for query in queries:
        assert series(query) and series(query) <= METRICS, query
    # A latency is not divided among replicas: the HPA must compare it as it is.
    assert all(t["metricType"] == "Value" for t in triggers(scaled, "prometheus"))


def test_no_list_outside_the_stacks_queues_is_scaled_on() -> None:
    lists = {DEFAULT_KEYS.queue_list(q) for q in QUEUES}
    for scaled in scaled_objects():
        for trigger in triggers(scaled, "redis"):
            assert trigger["metadata"]["listName"] in lists, trigger


@pytest.mark.parametrize("queue", QUEUES)
def test_each_scaled_object_targets_the_deployment_of_its_queues_worker(queue: str) -> None:
    target = for_queue(queue)["spec"]["scaleTargetRef"]["name"]
    deployment = deployments()[target]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["firsttoken", "worker"], command
    assert command[command.index("--queues") + 1] == queue, command
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    # The lists above are the default prefix's: a Deployment may not use another one.
    assert env.get("FIRSTTOKEN_REDIS_PREFIX", DEFAULT_KEYS.prefix) == DEFAULT_KEYS.prefix


def test_pools_that_must_always_run_never_scale_to_zero() -> None:
    # No chat worker: every chat is refused. No bulk worker: nobody sends on a dead chat
    # worker's usage rows (workers/bulk/sweep.py), which no queue length shows.
    from shared.keys import BULK_QUEUE

    for queue in (CHAT_QUEUE, BULK_QUEUE):
        assert for_queue(queue)["spec"]["minReplicaCount"] >= 1, queue


def test_a_worker_pod_outlives_its_warm_shutdown() -> None:
    from workers.app import SHUTDOWN_GRACE_S

    for name, deployment in deployments().items():
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > SHUTDOWN_GRACE_S, name


def test_every_alert_reads_series_the_stack_exports() -> None:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    names = {rule["alert"] for rule in rules}
    # The four the issue asks for: TTFT p99, queue wait, worker missing, error rate.
    assert {
        "FirsttokenTimeToFirstTokenP99High",
        "FirsttokenChatQueueWaitHigh",
        "FirsttokenWorkerMissing",
        "FirsttokenChatErrorRateHigh",
    } <= names
    for rule in rules:
        assert series(rule["expr"]) <= METRICS, rule["alert"]
        assert rule["annotations"]["runbook_url"] == "docs/operations.md#alerts"
    assert "## Alerts" in (ROOT / "docs" / "operations.md").read_text()


def test_celery_cannot_autoscale_the_thread_pools() -> None:
    """docs/operations.md says `--autoscale` does not apply to any firsttoken pool: Celery's
    autoscaler grows and shrinks a pool through `grow`/`shrink`, which its threads and solo
    pools (the only ones firsttoken runs) lack. If this fails, Celery gained them: revisit."""
    from celery.concurrency.solo import TaskPool as SoloPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    for pool in (ThreadPool, SoloPool):
        assert not hasattr(pool, "grow") and not hasattr(pool, "shrink"), pool


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is missing (Debian package `prometheus`; .ci/run installs it)")
    return subprocess.run(
        [binary, *args],
        cwd=DEPLOY / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts.test.yml"),
        ("check", "config", "prometheus.yml"),
    ],
    ids=["check-rules", "test-rules", "check-config"],
)
def test_promtool_accepts_the_alerts_and_the_scrape_config(args: tuple[str, ...]) -> None:
    proc = promtool(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _busy_series(query: str) -> tuple[list[dict[str, str]], float]:
    """Input series under which `query` has a known value: a queue whose every task waited
    between 0.1 and 0.5 s (p95 0.48 s), or chat slots half taken."""
    if "firsttoken_queue_wait_seconds" in series(query):
        (queue,) = re.findall(r'queue="([a-z]+)"', query)
        name = "firsttoken_queue_wait_seconds_bucket"
        return [
            {"series": f'{name}{{queue="{queue}",le="0.1"}}', "values": "0+0x20"},
            {"series": f'{name}{{queue="{queue}",le="0.5"}}', "values": "0+60x20"},
            {"series": f'{name}{{queue="{queue}",le="+Inf"}}', "values": "0+60x20"},
        ], 0.48
    assert series(query) == {"firsttoken_worker_chats_in_flight", "firsttoken_worker_capacity"}
    return [
        {"series": 'firsttoken_worker_chats_in_flight{instance="a"}', "values": "128x20"},
        {"series": 'firsttoken_worker_capacity{instance="a"}', "values": "256x20"},
    ], 0.5


def _idle_series(query: str) -> list[dict[str, str]]:
    """Series of a pool with nothing to do: buckets that stopped moving (quantile NaN)."""
    if "firsttoken_queue_wait_seconds" not in series(query):
        return [{"series": 'firsttoken_worker_capacity{instance="a"}', "values": "256x20"}]
    (queue,) = re.findall(r'queue="([a-z]+)"', query)
    name = "firsttoken_queue_wait_seconds_bucket"
    return [
        {"series": f'{name}{{queue="{queue}",le="0.1"}}', "values": "5x20"},
        {"series": f'{name}{{queue="{queue}",le="+Inf"}}', "values": "5x20"},
    ]


def test_every_keda_query_evaluates_to_a_number_busy_idle_or_without_series(
    tmp_path: Path,
) -> None:
    """Prometheus itself (`promtool test rules`) evaluates each ScaledObject's query: its
    value under load, and 0, never NaN or nothing (which KEDA reads as an error), when the
    pool is idle or its series do not exist yet."""
    tests = []
    for scaled in scaled_objects():
        for trigger in triggers(scaled, "prometheus"):
            query = trigger["metadata"]["query"]
            busy, value = _busy_series(query)
            for input_series, expected in ((busy, value), (_idle_series(query), 0), ([], 0)):
                tests.append(
                    {
                        "interval": "1m",
                        "input_series": input_series,
                        "promql_expr_test": [
                            {
                                "expr": query,
                                "eval_time": "10m",
                                "exp_samples": [{"labels": "{}", "value": expected}],
                            }
                        ],
                    }
                )
    path = tmp_path / "keda.test.yml"
    path.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": tests}))
    proc = promtool("test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _redis_commands(compose: Path) -> dict[str, list[str]]:
    services = yaml.safe_load(compose.read_text())["services"]
    return {
        name: [str(part) for part in svc["command"]]
        for name, svc in services.items()
        if str(svc.get("image", "")).startswith("redis:")
        and "redis-server" in svc.get("command", [])
    }


@pytest.mark.parametrize("compose", ["docker-compose.yml", "docker-compose.cluster.yml"])
def test_every_shipped_redis_keeps_an_append_only_file_synced_every_second(compose: str) -> None:
    """The usage outbox, the queues and the replay logs survive a Redis restart only in an
    append-only file (docs/operations.md): every redis-server the compose files ship has one."""
    commands = _redis_commands(ROOT / compose)
    assert commands, f"no redis-server in {compose}"
    for name, command in commands.items():
        # An option's value is the word after it (--replicaof takes two: no pairing by position).
        options = {word: command[i + 1] for i, word in enumerate(command[:-1]) if word[:2] == "--"}
        assert options.get("--appendonly") == "yes", (compose, name, command)
        assert options.get("--appendfsync") == "everysec", (compose, name, command)
