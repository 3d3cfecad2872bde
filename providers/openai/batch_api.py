"""OpenAI's Batch API as a client (``POST /files``, ``POST /batches``, ``GET
/batches/{id}``, ``GET /files/{id}/content``, ``POST /batches/{id}/cancel``), for the
gateway's provider-batch loop (docs/batches.md, "Through the provider's batch API").

One gateway batch is one upstream batch: its requests are written to a JSON Lines file
(``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``), uploaded with
purpose ``batch`` and submitted with a ``24h`` window; the output and error files' lines
(``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``) become
one ``RemoteResult`` per ``custom_id``. Bodies are OpenAI's chat completions already, kept
as the upstream wrote them. Non-2xx answers raise the mapped ``ProviderError``; transport
errors propagate as httpx's (the caller retries later either way).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import httpx
import msgspec

from core.remote_batch import RemoteResult, RemoteStatus
from core.wire import Usage
from providers.http import error_for_status
from providers.openai import wire

ENDPOINT = "/v1/chat/completions"
WINDOW = "24h"  # the only completion window OpenAI offers
_RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
_ENDED = frozenset({"completed", "expired", "cancelled"})


class _ErrorEntry(msgspec.Struct):
    code: str | None = None
    message: str | None = None


class _Errors(msgspec.Struct):
    data: list[_ErrorEntry] | None = None


class _Batch(msgspec.Struct):
    id: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: _Errors | None = None


class _FileObject(msgspec.Struct):
    id: str


class _Response(msgspec.Struct):
    status_code: int
    body: msgspec.Raw = msgspec.Raw(b"null")


class _LineError(msgspec.Struct):
    code: str | None = None
    message: str | None = None


class _Line(msgspec.Struct):
    custom_id: str
    response: _Response | None = None
    error: _LineError | None = None


class _UsageOnly(msgspec.Struct):
    usage: Usage | None = None


_batch = msgspec.json.Decoder(_Batch)
_file = msgspec.json.Decoder(_FileObject)
_line = msgspec.json.Decoder(_Line)
_usage = msgspec.json.Decoder(_UsageOnly)
_encode = msgspec.json.Encoder().encode


class OpenAIBatchApi:
    """The Batch API of the OpenAI-compatible upstream at ``base_url`` (``.../v1``)."""

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        base_url: str,
        api_key: str | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        self.name = name
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers)
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"

    def prepare(self, body: bytes, upstream_model: str) -> bytes:
        """The request line's ``body``: the client's, with the upstream's model."""
        return wire.rewrite_body(body, upstream_model)

    async def submit(self, requests: Sequence[tuple[str, bytes]], batch_id: str) -> str:
        """Upload the requests (``(custom_id, prepared body)``) and create the batch; its
        id. ``batch_id`` (the gateway's) goes into the batch's metadata."""
        lines = [
            _encode(
                {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": msgspec.Raw(body)}
            )
            for cid, body in requests
        ]
        content = b"".join(line + b"\n" for line in lines)
        file_id = _file.decode(await self._upload(f"{batch_id}.jsonl", content)).id
        create = {
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": WINDOW,
            "metadata": {"switchyard_batch_id": batch_id},
        }
        return _batch.decode(await self._call("POST", "/batches", _encode(create))).id

    async def status(self, remote_id: str) -> RemoteStatus:
        return _status(_batch.decode(await self._call("GET", f"/batches/{remote_id}")))

    async def results(
        self, remote_id: str, bodies: Mapping[str, bytes], created: int = 0
    ) -> dict[str, RemoteResult]:
        """Every line of the batch's output and error files, by ``custom_id`` (the first
        line wins should one appear twice). ``bodies`` and ``created`` are not needed
        here: the answers are OpenAI's own, kept as written."""
        batch = _batch.decode(await self._call("GET", f"/batches/{remote_id}"))
        found: dict[str, RemoteResult] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                content = await self._call("GET", f"/files/{file_id}/content")
                for raw in content.splitlines():
                    if raw.strip():
                        custom_id, result = read_line(raw)
                        found.setdefault(custom_id, result)
        return found

    async def cancel(self, remote_id: str) -> None:
        await self._call("POST", f"/batches/{remote_id}/cancel", b"{}")

    async def _upload(self, filename: str, content: bytes) -> bytes:
        boundary = "switchyard-" + secrets.token_hex(16)
        body = multipart(boundary, {"purpose": "batch"}, ("file", filename, content))
        headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
        return await self._send("POST", "/files", body, headers)

    async def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"content-type": "application/json"} if body is not None else {}
        return await self._send(method, path, body, headers)

    async def _send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> bytes:
        response = await self.client.request(
            method,
            self.base_url + path,
            content=body,
            headers={**headers, **self.headers},
            timeout=self.timeout_s,
        )
        content = response.content
        if not 200 <= response.status_code < 300:
            raise error_for_status(self.name, response, content, wire.read_error)
        return content


def _status(batch: _Batch) -> RemoteStatus:
    if batch.status in _RUNNING:
        return RemoteStatus(state="running", status=batch.status)
    if batch.status in _ENDED:
        return RemoteStatus(state="ended", status=batch.status)
    first = batch.errors.data[0] if batch.errors and batch.errors.data else _ErrorEntry()
    return RemoteStatus(
        state="failed",
        status=batch.status,
        code=first.code or "provider_batch_failed",
        message=first.message or f"The provider's batch ended with status '{batch.status}'.",
    )


def read_line(raw: bytes) -> tuple[str, RemoteResult]:
    """One output or error file line as (custom_id, result)."""
    line = _line.decode(raw)
    if line.response is not None:
        body = bytes(line.response.body)
        return line.custom_id, RemoteResult(
            status_code=line.response.status_code, body=body, usage=_usage_of(body)
        )
    error = line.error or _LineError()
    return line.custom_id, RemoteResult(
        error_code=error.code or "provider_error",
        error_message=error.message or "The provider answered this request with no response.",
    )


def _usage_of(body: bytes) -> Usage | None:
    try:
        return _usage.decode(body).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def multipart(boundary: str, fields: Mapping[str, str], file: tuple[str, str, bytes]) -> bytes:
    """A ``multipart/form-data`` body: the text ``fields``, then one file part."""
    parts: list[bytes] = []
    for name, value in fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
        parts.append(head.encode() + value.encode() + b"\r\n")
    field, filename, content = file
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}";'
        f' filename="{filename}"\r\nContent-Type: application/jsonl\r\n\r\n'
    )
    parts.append(head.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts)
