"""Gemini answers -> OpenAI shapes (pure): chat responses, embeddings, error bodies.

- text parts are concatenated into ``content``; ``thought: true`` parts are thought
  summaries, not the answer, and are concatenated into ``reasoning_content`` instead (their
  thought signatures are opaque and not kept); ``functionCall`` parts become ``tool_calls``
  with the part's ``id`` or ``call_<n>`` (n counts calls within the choice, so ids are
  deterministic);
- finish reasons: STOP -> stop (tool_calls when the turn called functions), MAX_TOKENS ->
  length, safety-style reasons -> content_filter, anything else -> stop; a prompt blocked
  before generation (``promptFeedback.blockReason``, no candidates) -> content_filter, "";
- usage: completion tokens include thinking tokens (``thoughtsTokenCount``, which Google
  bills as output but leaves out of ``candidatesTokenCount``), and they are also reported as
  ``completion_tokens_details.reasoning_tokens`` (a part of completion tokens, as in OpenAI's
  usage, so cost counts them once).
"""

from __future__ import annotations

import base64
import re
import struct

from core.errors import UpstreamMalformedError
from core.wire import (
    AssistantMessage,
    ChatResponse,
    Choice,
    EmbeddingItem,
    EmbeddingResponse,
    EmbeddingUsage,
    FinishReason,
    FunctionCall,
    ToolCall,
    Usage,
    encoder,
    make_usage,
)
from providers.gemini.wire import (
    BatchEmbedContentsRequest,
    Candidate,
    Content,
    EmbedContentRequest,
    GenerateContentResponse,
    Part,
    Status,
    UsageMetadata,
    error_decoder,
)
from providers.gemini.wire import encoder as gemini_encoder

_FILTERED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
)
_RPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def finish_reason(raw: str | None, called_functions: bool) -> FinishReason:
    """OpenAI's finish reason for Gemini's ``finishReason``."""
    if raw == "MAX_TOKENS":
        return "length"
    if raw in _FILTERED:
        return "content_filter"
    return "tool_calls" if called_functions else "stop"


def usage_of(meta: UsageMetadata | None) -> Usage | None:
    if meta is None:
        return None
    thoughts = meta.thoughts_token_count
    completion = meta.candidates_token_count + thoughts
    return make_usage(
        meta.prompt_token_count,
        completion,
        cached=meta.cached_content_token_count,
        reasoning=thoughts,
    )


def tool_call(part_id: str | None, name: str, args: object, number: int) -> ToolCall:
    """An OpenAI tool call; ``number`` is the call's position within its choice."""
    arguments = encoder.encode(args).decode()
    return ToolCall(id=part_id or f"call_{number}", function=FunctionCall(name, arguments))


def read_parts(parts: list[Part]) -> tuple[str, list[ToolCall]]:
    """The answer text and the tool calls in one candidate's parts (thoughts left out)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        if part.thought:
            continue
        if part.text is not None:
            texts.append(part.text)
        elif part.function_call is not None:
            call = part.function_call
            calls.append(tool_call(call.id, call.name, call.args, len(calls)))
    return "".join(texts), calls


def read_thoughts(parts: list[Part]) -> str | None:
    """The thought-summary text in one candidate's parts, or None when there is none."""
    thoughts = [part.text for part in parts if part.thought and part.text]
    return "".join(thoughts) if thoughts else None


def _choice(candidate: Candidate) -> Choice:
    content = candidate.content or Content()
    text, calls = read_parts(content.parts)
    message = AssistantMessage(
        content=text if text or not calls else None,
        tool_calls=calls or None,
        reasoning_content=read_thoughts(content.parts),
    )
    reason = finish_reason(candidate.finish_reason, bool(calls))
    return Choice(index=candidate.index, message=message, finish_reason=reason)


def is_blocked(resp: GenerateContentResponse) -> bool:
    """The prompt itself was blocked: no candidates, a ``blockReason``."""
    return not resp.candidates and bool(resp.prompt_feedback and resp.prompt_feedback.block_reason)


def to_chat_response(
    resp: GenerateContentResponse, *, model: str, fallback_id: str, created: int, provider: str
) -> ChatResponse:
    """An OpenAI chat completion for a ``generateContent`` answer.

    ``model`` is used when Gemini names no ``modelVersion``; ``fallback_id`` when it sends no
    ``responseId``. A reply with neither candidates nor a block reason is malformed.
    """
    if is_blocked(resp):
        blocked = AssistantMessage(content="")
        choices = [Choice(index=0, message=blocked, finish_reason="content_filter")]
    elif resp.candidates:
        choices = sorted((_choice(c) for c in resp.candidates), key=lambda c: c.index)
    else:
        raise UpstreamMalformedError(
            f"upstream {provider} answered without candidates", provider=provider
        )
    return ChatResponse(
        id=resp.response_id or fallback_id,
        created=created,
        model=resp.model_version or model,
        choices=choices,
        usage=usage_of(resp.usage_metadata),
    )


# ---------------------------------------------------------------- errors
def _retry_delay(details: list[dict[str, object]]) -> float | None:
    for detail in details:
        if str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            match = _DURATION.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def _reason(details: list[dict[str, object]]) -> str | None:
    for detail in details:
        if str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reason = detail.get("reason")
            return reason if isinstance(reason, str) else None
    return None


class ErrorFacts:
    """What one Gemini error body says: message, HTTP-ish code, ErrorInfo reason and the
    RetryInfo delay in seconds (Gemini reports waits there rather than in Retry-After)."""

    def __init__(self, status: Status) -> None:
        self.message = status.message or (status.status or "unknown error")
        code = status.code if 400 <= status.code < 600 else 0
        self.code = code or _RPC_STATUS.get(status.status or "", 500)
        self.reason = _reason(status.details)
        self.retry_delay = _retry_delay(status.details)


def read_error(body: bytes) -> ErrorFacts:
    """Decode ``{"error": {"code", "message", "status", "details"}}``; raises msgspec errors."""
    return ErrorFacts(error_decoder.decode(body).error)


def encode_status(status: Status) -> bytes:
    """Re-encode a mid-stream error object as a standalone error body."""
    return gemini_encoder.encode({"error": status})


# ---------------------------------------------------------------- embeddings
def embed_request(
    texts: list[str], model: str, dimensions: int | None
) -> EmbedContentRequest | BatchEmbedContentsRequest:
    """One text -> ``embedContent`` body; several -> ``batchEmbedContents`` body."""

    def one(text: str, named: bool) -> EmbedContentRequest:
        return EmbedContentRequest(
            content=Content(parts=[Part(text=text)]),
            model=f"models/{model}" if named else None,
            output_dimensionality=dimensions,
        )

    if len(texts) == 1:
        return one(texts[0], named=False)
    return BatchEmbedContentsRequest(requests=[one(text, named=True) for text in texts])


def _base64_floats(values: list[float]) -> str:
    # OpenAI's base64 format: little-endian float32, base64 encoded.
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def embedding_body(vectors: list[list[float]], model: str, encoding: str | None) -> bytes:
    """An OpenAI ``/v1/embeddings`` body. Gemini reports no token counts for embeddings, so
    usage is 0 (unknown), not an estimate."""
    items = [
        EmbeddingItem(index=i, embedding=_base64_floats(vector) if encoding == "base64" else vector)
        for i, vector in enumerate(vectors)
    ]
    return encoder.encode(EmbeddingResponse(data=items, model=model, usage=EmbeddingUsage()))
