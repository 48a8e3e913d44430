"""Prompt tokens per request on a long multi-turn script: bounded context vs full history.

    python scripts/bench_prompt.py [--turns 30] [--threshold 1000] [--recent 4]

Replays a scripted conversation (English and Chinese, user turns of 20-80 words, answers of
60-200) turn by turn. "naive" sends the template, every earlier message and the question;
"bounded" sends what the chat worker sends: the recent window plus the running summary once
the history passes the threshold (the summary is a fixed 120-word text here, as the summary
task would keep it at SUMMARY_MAX_WORDS). Counts use the same counter (tiktoken cl100k_base,
offline) and the builder's exact count. Deterministic: no timing in the token numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from shared.conversation import StoredMessage, WindowRules, select_window
from shared.prompt import Budget, PromptParts, Template, build_prompt, count_messages, counter_for
from shared.protocol import Message

WORDS_EN = (
    "the deployment plan needs a rollback step before we migrate the billing database and "
    "we agreed that the owner of each service signs off on latency budgets and error rates"
).split()
ZH = "我们讨论了迁移计划预算上线时间以及每个服务的负责人需要确认延迟和错误率"


def _text(rng: random.Random, words: int) -> str:
    if rng.random() < 0.3:
        return "".join(rng.choice(ZH) for _ in range(words * 2))
    return " ".join(rng.choice(WORDS_EN) for _ in range(words))


def script(turns: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [
        (_text(rng, rng.randint(20, 80)), _text(rng, rng.randint(60, 200))) for _ in range(turns)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--threshold", type=int, default=1000, help="CONTEXT_SUMMARY_AFTER_TOKENS")
    ap.add_argument("--recent", type=int, default=4, help="CONTEXT_RECENT_MESSAGES")
    ap.add_argument("--budget", type=int, default=32000)
    args = ap.parse_args()
    count = counter_for(None)
    budget = Budget(args.budget)
    summary = " ".join(WORDS_EN[i % len(WORDS_EN)] for i in range(120))
    rules = WindowRules(args.threshold, args.recent)
    naive_tokens: list[int] = []
    bounded_tokens: list[int] = []
    build_us: list[float] = []
    stored: list[StoredMessage] = []
    summary_upto: int | None = None
    for question, answer in script(args.turns):
        history = [Message(role=m.role, content=m.content) for m in stored]  # type: ignore[arg-type]
        naive = [Message(role="system", content=Template().role), *history,
                 Message(role="user", content=question)]  # fmt: skip
        naive_tokens.append(count_messages(naive, count, budget))
        start = time.perf_counter()
        window = select_window(
            stored, summary if summary_upto else None, summary_upto, rules, count
        )
        built = build_prompt(
            PromptParts(Template(), question, window.history, window.summary), budget, count
        )
        build_us.append((time.perf_counter() - start) * 1e6)
        bounded_tokens.append(built.prompt_tokens)
        if window.summarize_upto is not None:
            summary_upto = window.summarize_upto  # the summary task's result, next turn on
        n = len(stored)
        stored += [
            StoredMessage(n + 1, "user", question),
            StoredMessage(n + 2, "assistant", answer),
        ]
    half = args.turns // 2
    print(
        f"turns={args.turns} threshold={args.threshold} recent={args.recent} counter={count.name}"
    )
    for label, values in (("naive", naive_tokens), ("bounded", bounded_tokens)):
        med, mean = statistics.median(values), statistics.mean(values)
        print(
            f"{label:8s} median={med:7.0f} mean={mean:7.0f} "
            f"last={values[-1]:6d} median(2nd half)={statistics.median(values[half:]):7.0f}"
        )
    med_n, med_b = statistics.median(naive_tokens), statistics.median(bounded_tokens)
    print(f"reduction (median per request): {100 * (1 - med_b / med_n):.0f}%")
    print(f"window+build time: median {statistics.median(build_us):.0f} us per request")


if __name__ == "__main__":
    main()
