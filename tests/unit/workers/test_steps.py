"""workers/steps.py: a worker starts the steps its pools need, each after what it requires,
open-phase before ready-phase; a plan that cannot run is refused before anything starts."""

from __future__ import annotations

import pytest

from workers.lifecycle import STEPS
from workers.steps import Step, StepError, phase_of, plan


def _s(name: str, *requires: str, pools: set[str] | None = None, ready: bool = False) -> Step[None]:
    return Step(
        name,
        requires=requires,
        pools=None if pools is None else frozenset(pools),
        phase="ready" if ready else "open",
    )


def names(steps: list[Step[None]]) -> list[str]:
    return [s.name for s in steps]


def test_requirements_come_first_and_declaration_order_breaks_ties() -> None:
    steps = [_s("b", "a"), _s("a"), _s("c")]
    assert names(plan(steps, ["chat"])) == ["a", "b", "c"]


def test_a_pool_gets_only_the_steps_it_needs() -> None:
    steps = [
        _s("redis"),
        _s("watch", "redis", pools={"chat"}),
        _s("sweep", "redis", pools={"bulk"}),
    ]
    assert names(plan(steps, ["chat"])) == ["redis", "watch"]
    assert names(plan(steps, ["bulk", "summarize"])) == ["redis", "sweep"]
    assert names(plan(steps, [])) == ["redis"]


def test_open_steps_run_before_ready_steps() -> None:
    steps = [_s("beat", "redis", ready=True), _s("redis"), _s("listen", "redis")]
    ordered = plan(steps, ["chat"])
    assert names(ordered) == ["redis", "listen", "beat"]
    assert names(phase_of(ordered, "ready")) == ["beat"]


@pytest.mark.parametrize(
    ("steps", "queues", "why"),
    [
        ([_s("a", "missing")], ["chat"], "which no step is"),
        ([_s("a", "b"), _s("b", pools={"bulk"})], ["chat"], "do not run"),
        ([_s("a", "b"), _s("b", "a")], ["chat"], "cycle"),
        ([_s("a", "b"), _s("b", ready=True)], ["chat"], "is ready"),
        ([_s("a"), _s("a")], ["chat"], "share a name"),
    ],
)
def test_a_plan_that_cannot_run_is_refused(
    steps: list[Step[None]], queues: list[str], why: str
) -> None:
    with pytest.raises(StepError, match=why):
        plan(steps, queues)


def test_the_workers_own_steps_plan_for_every_pool() -> None:
    """The shipped steps: a chat worker marks its start and beats only once ready, with the
    dead-gateway watch; a bulk worker sweeps lost usage rows; a process with no queue (a test,
    a script) gets Redis and the database, never a heartbeat."""
    chat = plan(STEPS, ["chat"])
    assert names(phase_of(chat, "open")) == [
        "tracing", "redis", "database", "cancel-listener", "starting-mark", "cache-stage", "kb",
    ]  # fmt: skip
    assert names(phase_of(chat, "ready")) == ["heartbeat", "gateway-watch"]
    bulk = plan(STEPS, ["bulk"])
    assert names(phase_of(bulk, "ready")) == ["heartbeat", "usage-sweep"]
    assert "starting-mark" not in names(bulk) and "cache-stage" not in names(bulk)
    assert "heartbeat" not in names(plan(STEPS, []))
