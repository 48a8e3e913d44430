"""CPU of the chat worker's prompt assembly (retrieval's pure half) per chat.

    python scripts/bench_assemble.py [--chats 3000] [--repeat 5]

Every chat has its own question (as in `firsttoken bench`), the default template, a new
conversation and no knowledge base: what a benchmark chat costs between its sources and its
engine request. Prints the median over repeats of the mean microseconds per chat.
"""

from __future__ import annotations

import argparse
import statistics
import time

from shared.models import model_table
from shared.retrieval import SourceResult
from shared.settings import get_settings
from shared.tasks import ChatJob
from workers.retrieve import ConversationState, assemble


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chats", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    settings = get_settings()
    models = model_table(settings)
    now = time.time()
    results = {
        "user": SourceResult("user", "ok", 0.0, None),
        "conversation": SourceResult("conversation", "ok", 0.0, ConversationState(True)),
        "kb": SourceResult("kb", "ok", 0.0, []),
    }

    def job(i: int) -> ChatJob:
        question = f"What is the capital of country number {i}? Answer briefly, please."
        return ChatJob(
            job_id=f"j{i}",
            chat_id="c",
            tenant_id="t",
            key_id="k",
            messages=[{"role": "user", "content": question}],
            max_tokens=24,
            conversation_id=f"cv{i}",
            new_conversation=True,
            received_at=now,
            enqueued_at=now,
            deadline_at=now + 10,
        )

    means = []
    for r in range(args.repeat):
        jobs = [job(r * args.chats + i) for i in range(args.chats)]
        start = time.perf_counter()
        for j in jobs:
            assemble(settings, models, j, results)
        means.append((time.perf_counter() - start) / args.chats * 1e6)
    print(
        f"assemble: {statistics.median(means):.1f} us per chat (repeats: "
        + ", ".join(f"{m:.1f}" for m in means)
        + ")"
    )


if __name__ == "__main__":
    main()
