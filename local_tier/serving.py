"""OpenAI's protocol over the local JAX engine, shared by the in-process provider and the
HTTP worker.

Requests: ``ChatRequest``/``CompletionRequest`` (core.wire) -> a ``GenerationRequest`` whose
prompt and limits are checked here first, so errors name the client's field the way vLLM does
(``InvalidRequestError``/``ContextLengthError`` with ``param``). Outputs: the engine's delta
stream -> ``ChatResponse``, or OpenAI's exact chunk sequence (role chunk, content deltas,
finish chunk, then a ``choices=[]`` usage chunk when ``stream_options.include_usage``); the
same for legacy text completions, as raw JSON bytes. Engine errors map to ``core.errors``
inside ``engine_errors()``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import msgspec
from msgspec import Struct

from core.errors import (
    ContextLengthError,
    InvalidRequestError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    Choice,
    ChunkChoice,
    CompletionRequest,
    Delta,
    FinishReason,
    Message,
    RawStreamPart,
    TextPart,
    Usage,
    make_usage,
)
from local_tier.iterators import owned
from local_tier.jax.api import (
    EngineOverloadedError,
    EngineProtocol,
    EngineRequestError,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from local_tier.vllm_extensions import VllmExtensions

# OpenAI's (and vLLM's) default output cap for legacy completions.
DEFAULT_COMPLETION_TOKENS = 16
_encode = msgspec.json.Encoder().encode


class ResponseMeta(Struct, frozen=True):
    """The identity every response or chunk of one request repeats."""

    id: str
    created: int
    model: str


def new_meta(prefix: str, model: str) -> ResponseMeta:
    """``prefix`` is ``chatcmpl`` or ``cmpl``, as OpenAI names its ids."""
    return ResponseMeta(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)


# ---------------------------------------------------------------- requests
def check_chat_features(req: ChatRequest) -> None:
    """Reject what the local engine cannot do rather than silently ignore it."""
    if req.n is not None and req.n > 1:
        raise InvalidRequestError("Only n=1 is supported by this model server.", param="n")
    if req.tools and req.tool_choice != "none":
        raise InvalidRequestError("This model server does not support tools.", param="tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise InvalidRequestError(
            f"response_format '{req.response_format.type}' is not supported; only 'text'.",
            param="response_format",
        )
    for field in ("presence_penalty", "frequency_penalty"):
        if getattr(req, field):
            raise InvalidRequestError(f"{field} is not supported (only 0).", param=field)


def template_messages(messages: list[Message]) -> list[dict[str, object]]:
    """Messages as the chat template takes them: role and plain text only."""
    out: list[dict[str, object]] = []
    for msg in messages:
        role = "system" if msg.role == "developer" else msg.role
        out.append({"role": role, "content": _message_text(msg)})
    return out


def render_prompt(
    engine: EngineProtocol, messages: list[dict[str, object]], add_generation_prompt: bool = True
) -> str:
    """The model's chat template applied; a template that refuses the messages (it may
    insist on role order) is the client's error."""
    try:
        return engine.tokenizer.apply_chat_template(messages, add_generation_prompt)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param="messages") from exc


def _message_text(msg: Message) -> str:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content or ""
    texts = []
    for part in msg.content:
        if not isinstance(part, TextPart):
            raise InvalidRequestError("This model accepts text content only.", param="messages")
        texts.append(part.text)
    return "".join(texts)


def check_fit(
    prompt_len: int, max_tokens: int | None, max_model_len: int, fields: tuple[str, str]
) -> None:
    """Raise ``ContextLengthError`` when prompt + requested output exceed the context.

    ``fields`` names the prompt field and the output-limit field, for ``param``.
    """
    if prompt_len >= max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input.",
            param=fields[0],
        )
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise ContextLengthError(
            f"'{fields[1]}' is too large: {max_tokens}. This model's maximum context length "
            f"is {max_model_len} tokens and your request has {prompt_len} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_len}).",
            param=fields[1],
        )


def sampling_params(
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: list[str],
    seed: int | None,
    top_k: int | None = None,
) -> SamplingParams:
    """OpenAI's sampling fields -> the engine's, with OpenAI's defaults for absent ones."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=top_k or 0,
        seed=seed,
        stop=tuple(stop),
    )


def chat_generation(
    engine: EngineProtocol,
    req: ChatRequest,
    request_id: str,
    extensions: VllmExtensions | None = None,
) -> GenerationRequest:
    """Validate a chat request and turn it into the engine's request (the model's own chat
    template renders the prompt), with vLLM's ``extensions`` from the same body."""
    check_chat_features(req)
    prompt = render_prompt(engine, template_messages(req.messages))
    ids = engine.tokenizer.encode(prompt)
    limit_field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    check_fit(len(ids), req.output_limit(), engine.max_model_len, ("messages", limit_field))
    params = sampling_params(
        req.output_limit(), req.temperature, req.top_p, req.stop_list(), req.seed, req.top_k
    )
    return _with_extensions(GenerationRequest(request_id, ids, params), extensions)


def _with_extensions(
    request: GenerationRequest, extensions: VllmExtensions | None
) -> GenerationRequest:
    if extensions is not None:
        request.params = extensions.apply(request.params)
        request.priority = extensions.priority
    return request


def completion_generation(
    engine: EngineProtocol,
    req: CompletionRequest,
    request_id: str,
    extensions: VllmExtensions | None = None,
) -> GenerationRequest:
    """Validate a legacy completion request (one prompt, n=1) for the engine, with vLLM's
    ``extensions`` from the same body."""
    if req.n is not None and req.n > 1:
        raise InvalidRequestError("Only n=1 is supported by this model server.", param="n")
    if req.max_tokens == 0:
        raise InvalidRequestError("max_tokens must be at least 1.", param="max_tokens")
    ids = _prompt_ids(engine, req.prompt)
    max_tokens = DEFAULT_COMPLETION_TOKENS if req.max_tokens is None else req.max_tokens
    check_fit(len(ids), max_tokens, engine.max_model_len, ("prompt", "max_tokens"))
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    params = sampling_params(max_tokens, req.temperature, req.top_p, stop, req.seed)
    return _with_extensions(GenerationRequest(request_id, ids, params), extensions)


def _prompt_ids(engine: EngineProtocol, prompt: object) -> list[int]:
    """One prompt, as text or token ids (also wrapped in a one-item list)."""
    prompts = prompt if isinstance(prompt, list) and not _is_ids(prompt) else [prompt]
    if len(prompts) != 1:
        raise InvalidRequestError("Exactly one prompt per request is supported.", param="prompt")
    single = prompts[0]
    if isinstance(single, str) and single:
        return engine.tokenizer.encode(single)
    if isinstance(single, list) and _is_ids(single):
        return [int(token) for token in single]
    raise InvalidRequestError("The prompt must be non-empty text or token ids.", param="prompt")


def _is_ids(items: list[object]) -> bool:
    return bool(items) and all(isinstance(token, int) for token in items)


# ---------------------------------------------------------------- errors
@contextmanager
def engine_errors(provider: str = "") -> Iterator[None]:
    """Engine exceptions -> ``core.errors``: a bad request stays a 400 with its ``param``
    (``ContextLengthError`` when the engine says so), a full queue becomes a 429 with
    ``retry_after`` 1 s so the caller goes elsewhere or comes back soon."""
    try:
        yield
    except EngineRequestError as exc:
        cls = ContextLengthError if exc.code == ContextLengthError.code else InvalidRequestError
        raise cls(exc.message, param=exc.param) from exc
    except EngineOverloadedError as exc:
        raise UpstreamRateLimitedError(
            exc.message, provider=provider, upstream_status=exc.status, retry_after=1.0
        ) from exc


async def generate(
    engine: EngineProtocol, request: GenerationRequest, provider: str = ""
) -> AsyncIterator[GenerationOutput]:
    """``engine.generate`` with engine errors raised as ``core.errors``; closing this closes
    (aborts) the engine's sequence."""
    with engine_errors(provider):
        outputs = engine.generate(request)
        async with owned(outputs):
            async for out in outputs:
                yield out


def finish_reason(output: GenerationOutput) -> FinishReason:
    """The engine's final reason as OpenAI's. "abort" means the engine shut down under the
    request, which is a server failure, not an answer."""
    if output.finish_reason == "abort":
        raise UpstreamServerError("The model server stopped before the answer was complete.")
    return "length" if output.finish_reason == "length" else "stop"


def output_usage(output: GenerationOutput) -> Usage:
    return make_usage(output.prompt_tokens, output.completion_tokens, output.cached_tokens)


class Collected(Struct):
    """A whole answer: all text deltas joined, and the final output (reason and usage)."""

    text: str
    last: GenerationOutput


async def collect(outputs: AsyncIterator[GenerationOutput]) -> Collected:
    """Drain (and close) the engine's delta stream into one answer."""
    parts: list[str] = []
    async with owned(outputs):
        async for out in outputs:
            parts.append(out.text)
            if out.finish_reason is not None:
                finish_reason(out)  # an aborted answer raises here, not as a short reply
                return Collected("".join(parts), out)
    raise UpstreamServerError("The model server ended the answer without a finish reason.")


# ---------------------------------------------------------------- chat responses
def chat_response(meta: ResponseMeta, answer: Collected) -> ChatResponse:
    choice = Choice(0, AssistantMessage(content=answer.text), finish_reason(answer.last))
    return ChatResponse(
        meta.id, meta.created, meta.model, [choice], usage=output_usage(answer.last)
    )


def _chunk(meta: ResponseMeta, delta: Delta, reason: FinishReason | None = None) -> ChatChunk:
    return ChatChunk(meta.id, meta.created, meta.model, [ChunkChoice(0, delta, reason)])


async def chat_chunks(
    outputs: AsyncIterator[GenerationOutput], meta: ResponseMeta, include_usage: bool
) -> AsyncIterator[ChatChunk]:
    """OpenAI's chunk sequence for one choice. The role chunk goes first, before the engine's
    first output, and empty deltas (steps that produced no printable text) are skipped.
    Closing this generator closes ``outputs``."""
    async with owned(outputs):
        yield _chunk(meta, Delta(role="assistant", content=""))
        async for out in outputs:
            if out.text:
                yield _chunk(meta, Delta(content=out.text))
            if out.finish_reason is not None:
                yield _chunk(meta, Delta(), finish_reason(out))
                if include_usage:
                    usage = output_usage(out)
                    yield ChatChunk(meta.id, meta.created, meta.model, [], usage=usage)
                return
    raise UpstreamServerError("The model server ended the stream without a finish reason.")


# ---------------------------------------------------------------- legacy completions
class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None


class CompletionBody(Struct, omit_defaults=True, tag_field="object", tag="text_completion"):
    """A text completion (or chunk); the tag keeps ``object`` on the wire."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


def completion_body(meta: ResponseMeta, answer: Collected) -> tuple[bytes, Usage]:
    """A ``/v1/completions`` response body and its usage."""
    usage = output_usage(answer.last)
    choice = CompletionChoice(0, answer.text, finish_reason=finish_reason(answer.last))
    body = CompletionBody(meta.id, meta.created, meta.model, [choice], usage=usage)
    return _encode(body), usage


async def completion_stream(
    outputs: AsyncIterator[GenerationOutput], meta: ResponseMeta, include_usage: bool
) -> AsyncIterator[RawStreamPart]:
    """vLLM's completion chunk sequence: text deltas, the last one carrying the finish
    reason, then a ``choices=[]`` usage chunk when asked for. Closing it closes ``outputs``."""
    async with owned(outputs):
        async for out in outputs:
            reason = None if out.finish_reason is None else finish_reason(out)
            if out.text or reason is not None:
                choice = CompletionChoice(0, out.text, finish_reason=reason)
                body = CompletionBody(meta.id, meta.created, meta.model, [choice])
                yield RawStreamPart(_encode(body))
            if reason is not None:
                if include_usage:
                    usage = output_usage(out)
                    body = CompletionBody(meta.id, meta.created, meta.model, [], usage=usage)
                    yield RawStreamPart(_encode(body), usage)
                return
    raise UpstreamServerError("The model server ended the stream without a finish reason.")
