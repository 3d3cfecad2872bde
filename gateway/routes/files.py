"""OpenAI's Files API, for batch input files and batch results: ``POST /v1/files``
(multipart ``file`` + ``purpose=batch``; the JSONL is validated on upload, a 400 lists the
bad lines), ``GET /v1/files``, ``GET /v1/files/{id}``, ``DELETE /v1/files/{id}``,
``GET /v1/files/{id}/content``. A tenant sees its own files only: another tenant's id is
a 404, like an id that never existed."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler

from gateway.http.guard import authenticate
from gateway.jobs.api import (
    MULTIPART_SLACK,
    answer,
    check_upload,
    order_param,
    page_params,
    read_upload,
    runner_of,
    unknown_cursor,
)
from policies.jobs.errors import no_file
from policies.jobs.files import UnknownCursor
from policies.jobs.objects import FILE_PURPOSE, FileDeleted

PATH = "/v1/files"
_LIST_MAX = 10_000  # OpenAI's page size bounds for files


async def _upload(request: Request[Any, Any, Any]) -> Response[bytes]:
    principal = authenticate(request)
    runner = runner_of(request)
    upload = await read_upload(request, runner.settings.max_file_bytes)
    await check_upload(request.app.state.gateway.runtime, principal, upload.content)
    created = await runner.store.add_file(
        principal,
        filename=upload.filename,
        purpose=FILE_PURPOSE,
        content=upload.content,
        expires_after_s=upload.expires_after_s,
    )
    return answer(created)


def upload_handler(max_file_bytes: int) -> HTTPRouteHandler:
    """``POST /v1/files``, taking bodies up to ``max_file_bytes`` (plus the multipart
    framing) where every other route keeps ``server.max_body_bytes``."""
    limit = max_file_bytes + MULTIPART_SLACK
    return post(PATH, status_code=200, request_max_body_size=limit, name="upload_file")(_upload)


@get(PATH)
async def list_files(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The caller's files, newest first (``order=asc`` for oldest first)."""
    principal = authenticate(request)
    after, limit = page_params(request, default=_LIST_MAX, maximum=_LIST_MAX)
    purpose = request.query_params.get("purpose") or None
    try:
        page = await runner_of(request).store.files(
            principal, after=after, limit=limit, order=order_param(request), purpose=purpose
        )
    except UnknownCursor as exc:
        raise unknown_cursor(str(exc)) from exc
    return answer(page)


@get(PATH + "/{file_id:str}")
async def retrieve_file(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    principal = authenticate(request)
    found = await runner_of(request).store.file(principal, file_id)
    if found is None:
        raise no_file(file_id)
    return answer(found)


@delete(PATH + "/{file_id:str}", status_code=200)
async def delete_file(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    principal = authenticate(request)
    if not await runner_of(request).store.delete_file(principal, file_id):
        raise no_file(file_id)
    return answer(FileDeleted(id=file_id, deleted=True))


@get(PATH + "/{file_id:str}/content")
async def file_content(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    """The file's bytes as they were uploaded (or, for results, written)."""
    principal = authenticate(request)
    found = await runner_of(request).store.content(principal, file_id)
    if found is None:
        raise no_file(file_id)
    file, content = found
    headers = {"content-disposition": f'attachment; filename="{file.id}.jsonl"'}
    return Response(content, media_type="application/octet-stream", headers=headers)
