"""Anthropic's Message Batches API as a client (``POST /v1/messages/batches``, ``GET
/v1/messages/batches/{id}``, its ``results_url``, ``POST .../cancel``), for the gateway's
provider-batch loop (docs/batches.md, "Through the provider's batch API").

Requests are the adapter's own conversion of each chat body to Messages ``params``
(``cache_control.encode_request``, as for ``POST /v1/messages``); results come back as
JSON Lines ``{"custom_id", "result": {"type": "succeeded", "message"} | {"type":
"errored", "error"} | {"type": "canceled"} | {"type": "expired"}}`` and a succeeded
message is converted to an OpenAI chat completion with the adapter's converter
(``convert.to_chat_response``), so the output file reads as if the request had run one at a
time. Anthropic's ``custom_id`` must match ``^[a-zA-Z0-9_-]{1,64}$``: the caller passes
ids of that form. Non-2xx answers raise the mapped ``ProviderError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx
import msgspec

from core.config import AnthropicProviderConfig
from core.errors import GatewayError, InvalidRequestError
from core.remote_batch import RemoteResult, RemoteStatus
from core.wire import ChatRequest
from core.wire import encoder as openai_encoder
from providers.anthropic import convert, wire
from providers.anthropic.adapter import read_error_message
from providers.anthropic.cache_control import encode_request
from providers.http import error_for_status

BATCHES = "/v1/messages/batches"
# Anthropic's error types -> (HTTP status, OpenAI's error type) of the answer recorded
_ERRORS = {
    "invalid_request_error": (400, "invalid_request_error"),
    "authentication_error": (401, "authentication_error"),
    "billing_error": (402, "invalid_request_error"),
    "permission_error": (403, "permission_error"),
    "not_found_error": (404, "not_found_error"),
    "request_too_large": (413, "invalid_request_error"),
    "rate_limit_error": (429, "rate_limit_error"),
    "overloaded_error": (503, "server_error"),
}

# results that never ran -> (the error line's code, why)
_NOT_RUN = {
    "canceled": ("batch_cancelled", "the batch was cancelled"),
    "expired": ("batch_expired", "the batch expired"),
}


class _Batch(msgspec.Struct):
    id: str
    processing_status: str
    results_url: str | None = None


class _ErrorObject(msgspec.Struct):
    type: str = "api_error"
    message: str = ""


class _ErrorResponse(msgspec.Struct):
    error: _ErrorObject = msgspec.field(default_factory=_ErrorObject)


class _Result(msgspec.Struct):
    type: str
    message: msgspec.Raw = msgspec.Raw(b"null")  # (msgspec reads ``Raw | None`` as null only)
    error: _ErrorResponse | None = None


class _Line(msgspec.Struct):
    custom_id: str
    result: _Result


_batch = msgspec.json.Decoder(_Batch)
_line = msgspec.json.Decoder(_Line)
_chat = msgspec.json.Decoder(ChatRequest)
_encode = msgspec.json.Encoder().encode


class AnthropicBatchApi:
    """The Message Batches API at ``base_url`` (Anthropic's, without ``/v1``)."""

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        config: AnthropicProviderConfig,
        api_key: str | None,
        base_url: str | None = None,
    ) -> None:
        self.name = name
        self.client = client
        self.config = config
        self.base_url = (base_url or config.base_url).rstrip("/")
        self.headers = {"anthropic-version": config.anthropic_version}
        if api_key:
            self.headers["x-api-key"] = api_key
        self.headers.update(config.headers)

    def prepare(self, body: bytes, upstream_model: str) -> bytes:
        """The Messages ``params`` for a chat body (400 ``InvalidRequestError`` when it
        cannot be expressed for Anthropic)."""
        try:
            req = _chat.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRequestError(f"The request body is invalid: {exc}") from exc
        default = self.config.default_max_tokens
        return encode_request(req, upstream_model, default, stream=False, raw_body=body)

    async def submit(self, requests: Sequence[tuple[str, bytes]], batch_id: str) -> str:
        """Create the batch from ``(custom_id, params)`` pairs; its id."""
        payload = {
            "requests": [{"custom_id": cid, "params": msgspec.Raw(p)} for cid, p in requests]
        }
        return _batch.decode(await self._send("POST", BATCHES, _encode(payload))).id

    async def status(self, remote_id: str) -> RemoteStatus:
        batch = _batch.decode(await self._send("GET", f"{BATCHES}/{remote_id}"))
        if batch.processing_status == "ended":
            return RemoteStatus(state="ended", status="ended")
        return RemoteStatus(state="running", status=batch.processing_status)

    async def results(
        self, remote_id: str, bodies: Mapping[str, bytes], created: int = 0
    ) -> dict[str, RemoteResult]:
        """Every result line by ``custom_id``; ``bodies`` (the chat bodies by custom_id)
        tell which answers were asked for as JSON (a json_schema tool call is the text)."""
        batch = _batch.decode(await self._send("GET", f"{BATCHES}/{remote_id}"))
        path = f"{BATCHES}/{remote_id}/results"
        url = batch.results_url
        # Only the provider's own host gets the key: a results_url elsewhere is not followed.
        if url and url.startswith(self.base_url + "/"):
            path = url[len(self.base_url) :]
        content = await self._send("GET", path)
        found: dict[str, RemoteResult] = {}
        for raw in content.splitlines():
            if raw.strip():
                line = _line.decode(raw)
                found.setdefault(line.custom_id, self._result(line, bodies, created))
        return found

    async def cancel(self, remote_id: str) -> None:
        await self._send("POST", f"{BATCHES}/{remote_id}/cancel")

    def _result(self, line: _Line, bodies: Mapping[str, bytes], created: int) -> RemoteResult:
        result = line.result
        if result.type == "succeeded" and bytes(result.message) != b"null":
            return self._succeeded(result.message, bodies.get(line.custom_id), created)
        if result.type == "errored":
            return errored((result.error or _ErrorResponse()).error)
        code, why = _NOT_RUN.get(result.type, ("provider_error", result.type))
        return RemoteResult(
            error_code=code, error_message=f"The provider did not run this request: {why}."
        )

    def _succeeded(self, message: msgspec.Raw, body: bytes | None, created: int) -> RemoteResult:
        try:
            json_tool = convert.json_tool_name(_chat.decode(body)) if body else None
            decoded = wire.response_decoder.decode(message)
            response = convert.to_chat_response(
                decoded, created=created, json_tool=json_tool, provider=self.name
            )
        except (msgspec.DecodeError, msgspec.ValidationError, GatewayError) as exc:
            return _server_error(f"The provider's answer could not be read: {exc}")
        return RemoteResult(
            status_code=200, body=openai_encoder.encode(response), usage=response.usage
        )

    async def _send(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = dict(self.headers)
        if body is not None:
            headers["content-type"] = "application/json"
        response = await self.client.request(
            method,
            self.base_url + path,
            content=body,
            headers=headers,
            timeout=self.config.timeout_s,
        )
        content = response.content
        if not 200 <= response.status_code < 300:
            raise error_for_status(self.name, response, content, read_error_message)
        return content


def errored(error: _ErrorObject) -> RemoteResult:
    """An errored request as the answer the gateway would have given it, in OpenAI's shape."""
    status, kind = _ERRORS.get(error.type, (500, "server_error"))
    body = {"error": {"message": error.message, "type": kind, "param": None, "code": None}}
    return RemoteResult(status_code=status, body=_encode(body))


def _server_error(message: str) -> RemoteResult:
    return errored(_ErrorObject(type="api_error", message=message))
