"""Simulated engine profiles: the engine settings every mode of one bench run shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    ttft_ms: float
    itl_ms: float
    max_tokens: int
    description: str
    jitter: float = 0.0
    # High enough that the simulator never queues at the loads we drive: queueing inside the
    # engine would show up identically in every mode and hide the gateway's own cost.
    max_seqs: int = 4096
    # > 0: tokens on a shared step clock, as a batched decoder emits them (workers/engines/sim.py).
    step_ms: float = 0.0
    # Every answer exactly `max_tokens` long: the simulator draws a length in [its max_tokens/2,
    # its max_tokens], so it is given twice the requests' `max_tokens`, which then cuts every
    # answer at the same length.
    exact: bool = False

    def sim_args(self) -> list[str]:
        """Options for `python -m firsttoken.simserver`."""
        return [
            "--ttft-ms",
            str(self.ttft_ms),
            "--itl-ms",
            str(self.itl_ms),
            "--max-tokens",
            str(self.max_tokens * 2 if self.exact else self.max_tokens),
            "--max-seqs",
            str(self.max_seqs),
            "--jitter",
            str(self.jitter),
            "--step-ms",
            str(self.step_ms),
        ]

    @property
    def full_answer_ms(self) -> float:
        """Rough time of the longest answer at low load (the simulator picks a length in
        [max_tokens/2, max_tokens] per prompt)."""
        return self.ttft_ms + self.itl_ms * (self.max_tokens - 1)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "chat-8b",
            150.0,
            15.0,
            128,
            "an 8B chat model on one GPU: TTFT 150 ms, 15 ms between tokens, <=128 tokens",
        ),
        Profile(
            "chat-8b-steps",
            150.0,
            15.0,
            128,
            "chat-8b with vLLM-like steps: every running answer's next token at the same "
            "15 ms step, as a batched decoder emits them",
            step_ms=15.0,
        ),
        Profile(
            "slow-api",
            800.0,
            25.0,
            400,
            "the article's before-state: TTFT 800 ms, 25 ms between tokens, <=400 tokens "
            "(about 10 s per full answer)",
        ),
        Profile("tiny", 20.0, 2.0, 16, "for tests: TTFT 20 ms, 2 ms between tokens, <=16 tokens"),
        Profile(
            "on-the-bench",
            20.0,
            20.0,
            64,
            "the public 'On the Bench' gateway comparison's mock: TTFT 20 ms, then 64 deltas "
            "20 ms apart, every answer (use with --interleave --concurrency 1,32)",
            exact=True,
        ),
        Profile(
            "many-streams",
            500.0,
            500.0,
            30,
            "for open-stream counts: TTFT 500 ms, 500 ms between tokens, <=30 tokens (streams "
            "stay open ~8-15 s at ~2 tokens/s each, so 1,000 of them stay within what 2 cores "
            "of workers can feed)",
        ),
        Profile(
            "firehose",
            50.0,
            5.0,
            256,
            "for relay throughput: TTFT 50 ms, 5 ms between tokens, <=256 tokens",
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
