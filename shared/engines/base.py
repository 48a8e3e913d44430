"""The engine interface: one seam, several real implementations (sim, openai, vllm)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from shared.protocol import Message


@dataclass(frozen=True, slots=True)
class EngineRequest:
    messages: list[Message]
    model: str
    max_tokens: int
    temperature: float | None = None
    # The last message is the start of the assistant's answer, to be continued (a chat taken
    # over after its worker died, shared/failover.py): vLLM's `continue_final_message`.
    continue_final: bool = False


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the answer. The last delta of a stream carries finish_reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Prompt tokens the engine served from its prefix cache, where it reports them.
    cached_prompt_tokens: int | None = None


@dataclass(slots=True)
class EngineStats:
    started: int = 0
    finished: int = 0
    aborted: int = 0
    running: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    """Streams deltas for a request; ``abort`` (or cancelling the iterating task) stops it.

    Implementations raise ``shared.errors.EngineError`` for failures of the model server.
    """

    name: str

    def stream(self, request: EngineRequest, *, request_id: str) -> AsyncIterator[Delta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def aclose(self) -> None: ...
