"""The peer: the LiteLLM proxy in front of the same simulated engine.

It lives in its own virtualenv (``.venvs/litellm``, created on demand with
``pip install 'litellm[proxy]'``), never in firsttoken's environment: it pins its own versions of
shared libraries. Clients reach it with the same OpenAI streaming client as the `direct` mode,
so the only difference between the two is the proxy.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import venv
from pathlib import Path

from firsttoken.bench.stack import ROOT, free_port, http_get, wait_for
from firsttoken.procs import Child

VENV = ROOT / ".venvs" / "litellm"
PACKAGE = "litellm[proxy]"


def ensure_venv(path: Path = VENV) -> Path:
    """The `litellm` executable, installing the proxy into its own virtualenv if needed."""
    exe = path / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"creating {path} and installing {PACKAGE} (a few minutes, once)...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True).create(path)
    subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", PACKAGE], check=True
    )
    return exe


class LiteLLMPeer:
    """One LiteLLM proxy process (one worker, no database, caching off)."""

    model = "sim"

    def __init__(self, engine_url: str, workdir: Path, engine_model: str = "sim") -> None:
        self.engine_url, self.workdir, self.engine_model = engine_url, workdir, engine_model
        self.master_key = "sk-bench-" + secrets.token_hex(8)
        self.port = 0
        self.child: Child | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        exe = ensure_venv()
        config = self.workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {self.model}\n"
            "    litellm_params:\n"
            f"      model: openai/{self.engine_model}\n"
            f"      api_base: {self.engine_url}\n"
            "      api_key: EMPTY\n"
            "litellm_settings:\n"
            "  cache: false\n"
            "  drop_params: true\n"
        )
        self.port = free_port()
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
        env.update(
            LITELLM_LOG="ERROR",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            LITELLM_MASTER_KEY=self.master_key,
            PYTHONUNBUFFERED="1",
        )
        self.child = Child(
            [
                str(exe),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--num_workers",
                "1",
            ],
            env,
            self.workdir / "litellm.log",
        )
        url = f"http://127.0.0.1:{self.port}/health/liveliness"
        wait_for(lambda: http_get(url)[0] == 200, 120, "LiteLLM proxy", {"litellm": self.child})

    def stop(self) -> None:
        if self.child:
            self.child.stop()
