"""A worker process's life as steps: a small equivalent of Celery's bootsteps for what runs on
the process loop (workers/runtime.py).

Each step names the steps it requires and the pools (queues) that need it; a worker starts the
steps its queues need, each after what it requires, and stops the ones it started in reverse.
A step runs in one of two phases: ``open`` when the process starts, ``ready`` once a chat
worker has warmed up (a pool without a warm-up is ready at once), so a gateway never counts a
worker that would meet its first chats cold. Pure: a plan is values; workers/lifecycle.py runs
it and the steps themselves are declared there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

C = TypeVar("C")
Phase = Literal["open", "ready"]


@dataclass(frozen=True, slots=True)
class Step(Generic[C]):
    """One piece of a worker's life: `start` and `stop` take the process's context."""

    name: str
    start: Callable[[C], Awaitable[None]] | None = None
    stop: Callable[[C], Awaitable[None]] | None = None
    requires: tuple[str, ...] = ()
    # The queues whose pools need it (any one of them); None: every pool.
    pools: frozenset[str] | None = None
    phase: Phase = "open"

    def wanted(self, queues: Iterable[str]) -> bool:
        return self.pools is None or not self.pools.isdisjoint(queues)


class StepError(ValueError):
    """A plan that cannot run: a missing requirement, a cycle, a ready step required by an
    open one, or two steps of one name."""


def plan(steps: Sequence[Step[C]], queues: Iterable[str]) -> list[Step[C]]:
    """The steps `queues` need, each after the steps it requires (in declaration order where
    the requirements leave a choice), open-phase steps before ready-phase ones."""
    queues = tuple(queues)
    by_name = {s.name: s for s in steps}
    if len(by_name) != len(steps):
        raise StepError("two steps share a name")
    chosen = {s.name for s in steps if s.wanted(queues)}
    for name in sorted(chosen):
        step = by_name[name]
        for need in step.requires:
            if need not in by_name:
                raise StepError(f"step {name!r} requires {need!r}, which no step is")
            if need not in chosen:
                raise StepError(f"step {name!r} requires {need!r}, which these pools do not run")
            if step.phase == "open" and by_name[need].phase == "ready":
                raise StepError(f"step {name!r} opens before {need!r}, which it requires, is ready")
    ordered: list[Step[C]] = []
    placed: set[str] = set()
    visiting: set[str] = set()

    def place(step: Step[C]) -> None:
        if step.name in placed:
            return
        if step.name in visiting:
            raise StepError(f"steps require each other in a cycle through {step.name!r}")
        visiting.add(step.name)
        for need in step.requires:
            place(by_name[need])
        visiting.discard(step.name)
        placed.add(step.name)
        ordered.append(step)

    for phase in ("open", "ready"):
        for step in steps:
            if step.name in chosen and step.phase == phase:
                place(step)
    return ordered


def phase_of(steps: Sequence[Step[C]], phase: Phase) -> list[Step[C]]:
    return [s for s in steps if s.phase == phase]
