"""Gemini (Generative Language API, ``v1beta``) JSON shapes as msgspec Structs.

Field names are Gemini's camelCase (``rename="camel"``). Requests are encoded with
``omit_defaults`` so only fields that carry a value go on the wire; responses are decoded
leniently (unknown fields ignored) because Google adds fields without notice.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

JSONObject = dict[str, Any]


class _Camel(Struct, rename="camel", omit_defaults=True):
    pass


# ---------------------------------------------------------------- contents
class Blob(_Camel):
    """``inlineData``: base64 bytes with their MIME type."""

    mime_type: str
    data: str


class FileData(_Camel):
    """``fileData``: a URI the service fetches itself."""

    mime_type: str
    file_uri: str


class FunctionCall(_Camel):
    name: str
    args: JSONObject = {}
    id: str | None = None


class FunctionResponse(_Camel):
    name: str
    response: JSONObject
    id: str | None = None


class Part(_Camel):
    """One part of a turn; exactly one of the payload fields is set.

    ``thought`` marks thinking-summary text that is not part of the answer.
    """

    text: str | None = None
    inline_data: Blob | None = None
    file_data: FileData | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    thought: bool | None = None
    thought_signature: str | None = None


class Content(_Camel):
    parts: list[Part] = []
    role: str | None = None


# ---------------------------------------------------------------- tools and config
class FunctionDeclaration(_Camel):
    name: str
    description: str | None = None
    parameters: JSONObject | None = None


class GeminiTool(_Camel):
    function_declarations: list[FunctionDeclaration]


class FunctionCallingConfig(_Camel):
    mode: str
    allowed_function_names: list[str] | None = None


class ToolConfig(_Camel):
    function_calling_config: FunctionCallingConfig


class ThinkingConfig(_Camel):
    """``thinkingBudget``: thinking tokens allowed (0 turns thinking off where the model
    allows it); ``includeThoughts``: return thought summaries as ``thought`` parts."""

    thinking_budget: int | None = None
    include_thoughts: bool | None = None


class GenerationConfig(_Camel):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_output_tokens: int | None = None
    stop_sequences: list[str] | None = None
    seed: int | None = None
    candidate_count: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_mime_type: str | None = None
    response_schema: JSONObject | None = None
    thinking_config: ThinkingConfig | None = None


class GenerateContentRequest(_Camel):
    contents: list[Content]
    system_instruction: Content | None = None
    tools: list[GeminiTool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None


# ---------------------------------------------------------------- responses
class Candidate(_Camel):
    content: Content | None = None
    finish_reason: str | None = None
    index: int = 0


class UsageMetadata(_Camel):
    prompt_token_count: int = 0
    candidates_token_count: int = 0
    total_token_count: int = 0
    cached_content_token_count: int = 0
    thoughts_token_count: int = 0


class PromptFeedback(_Camel):
    block_reason: str | None = None


class GenerateContentResponse(_Camel):
    candidates: list[Candidate] = []
    usage_metadata: UsageMetadata | None = None
    prompt_feedback: PromptFeedback | None = None
    model_version: str | None = None
    response_id: str | None = None


class Status(_Camel):
    """Google's ``google.rpc.Status`` as the REST API renders it."""

    code: int = 0
    message: str = ""
    status: str | None = None
    details: list[JSONObject] = []


class ErrorEnvelope(_Camel):
    error: Status


class StreamEvent(GenerateContentResponse):
    """One ``data:`` payload of ``streamGenerateContent?alt=sse``: a full response, or an
    ``{"error": {...}}`` object when the call fails after the stream began."""

    error: Status | None = None


# ---------------------------------------------------------------- embeddings
class EmbedContentRequest(_Camel):
    content: Content
    model: str | None = None
    output_dimensionality: int | None = None


class BatchEmbedContentsRequest(_Camel):
    requests: list[EmbedContentRequest]


class ContentEmbedding(_Camel):
    values: list[float] = []


class EmbedContentResponse(_Camel):
    embedding: ContentEmbedding


class BatchEmbedContentsResponse(_Camel):
    embeddings: list[ContentEmbedding] = []


# Module-level codecs, reused on every call (msgspec builds its decoding plan once).
encoder = msgspec.json.Encoder()
response_decoder = msgspec.json.Decoder(GenerateContentResponse)
event_decoder = msgspec.json.Decoder(StreamEvent)
error_decoder = msgspec.json.Decoder(ErrorEnvelope)
embed_decoder = msgspec.json.Decoder(EmbedContentResponse)
batch_embed_decoder = msgspec.json.Decoder(BatchEmbedContentsResponse)
