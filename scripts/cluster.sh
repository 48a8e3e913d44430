#!/usr/bin/env bash
# A firsttoken cluster on this one machine, to try (issue 33): each host a network namespace on a
# bridge, two gateways behind HAProxy, two chat-worker hosts with an engine each, a bulk-worker
# host, a Redis primary with a replica and three Sentinels, the machine's PostgreSQL forwarded
# in. The same bed tests/cluster runs (tests/cluster/bed.py).
#
#   scripts/cluster.sh up     bring it up on a fresh database, print the websocket URL and an
#                             API key, keep it up until Ctrl-C
#   scripts/cluster.sh down   remove what a bed killed without Ctrl-C left (namespaces, bridge)
#
# Needs root (ip netns), haproxy, redis-server and redis-sentinel (Debian: apt-get install -y
# haproxy redis-sentinel), PostgreSQL at FIRSTTOKEN_TEST_POSTGRES_URL (default
# postgresql://postgres@127.0.0.1:5432/postgres). Try it from this machine with what `up` prints:
#   firsttoken chat --url ws://10.200.X.10:8080/v1/ws --api-key KEY "hello"
# and lose a host: kill -9 $(ip netns pids <tag>-gw1)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python -m tests.cluster.bed "$@"
