"""A provider batch's results as the item-by-item path would have recorded them: one output
or error line per request (``policies.jobs.objects``) and one ledger row per answered
request, priced at its target's price times ``1 - batch.discount`` (``policies.pricing``,
as ``Scope`` prices a batch item). Pure: no I/O.

Requests go to the provider under ids made from their line (``line-<n>``: Anthropic allows
only ``[a-zA-Z0-9_-]{1,64}``, and a client's custom_id may hold anything), mapped back
here. An answered request's ``request_id`` is derived from the batch id and its line, so a
gateway that records the same results twice (it died between the ledger and the store)
appends the same rows, which the ledger keeps once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import NamedTuple

from core.remote_batch import RemoteResult
from core.tenancy import Principal, UsageRow
from gateway.telemetry.record import SAFE_ID
from policies.jobs.objects import answered_line, error_line
from policies.jobs.remote import Outcome, RemoteClaim, RemoteItem
from policies.jobs.usage import NO_USAGE, item_usage, requested_model
from policies.pricing import cost_usd
from routers.targets import Target


def remote_custom_id(line: int) -> str:
    """The id a request travels under to the provider."""
    return f"line-{line}"


def remote_request_id(batch_id: str, line: int) -> str:
    """The gateway's request id (the ledger row's key) of a request answered in a provider
    batch: the same every time it is computed."""
    digest = hashlib.blake2b(f"{batch_id}:{line}".encode(), digest_size=12).hexdigest()
    return f"req_{digest}"


class Settled(NamedTuple):
    outcomes: list[Outcome]
    rows: list[UsageRow]
    model: str | None  # the batch's alias: the first answered request's


def settle(
    claim: RemoteClaim,
    target: Target | None,
    results: Mapping[str, RemoteResult],
    *,
    refused: Mapping[int, RemoteResult],
    missing: RemoteResult,
    principal: Principal,
    discount: float,
    wall: float,
) -> Settled:
    """Each item's outcome: the provider's result for it, else its refusal (a body that
    could not be converted: no ledger row, as for a 400 before admission), else
    ``missing``. ``target`` None: nothing was answered (no rows)."""
    outcomes: list[Outcome] = []
    rows: list[UsageRow] = []
    model: str | None = None
    for item in claim.items:
        if item.line in refused:
            outcomes.append(_outcome(claim.batch_id, item, refused[item.line]))
            continue
        result = results.get(remote_custom_id(item.line), missing)
        outcomes.append(_outcome(claim.batch_id, item, result))
        if result.status_code is None or target is None:
            continue
        rows.append(_row(claim.batch_id, item, result, target, principal, discount, wall))
        if model is None and 200 <= result.status_code < 300:
            model = requested_model(item.body)
    return Settled(outcomes, rows, model)


def _outcome(batch_id: str, item: RemoteItem, result: RemoteResult) -> Outcome:
    if result.status_code is None:
        code = result.error_code or "provider_error"
        line = error_line(item.custom_id, code, result.error_message or code)
        return Outcome(item.line, False, line, NO_USAGE)
    request_id = remote_request_id(batch_id, item.line)
    line = answered_line(item.custom_id, result.status_code, request_id, result.body)
    ok = 200 <= result.status_code < 300
    return Outcome(item.line, ok, line, item_usage(result.body) if ok else NO_USAGE)


def _row(
    batch_id: str,
    item: RemoteItem,
    result: RemoteResult,
    target: Target,
    principal: Principal,
    discount: float,
    wall: float,
) -> UsageRow:
    usage, status = result.usage, result.status_code or 0
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else 0
    cached = usage.cached_tokens if usage else 0
    return UsageRow(
        request_id=remote_request_id(batch_id, item.line),
        ts=wall,
        tenant=principal.tenant,
        key_id=principal.key_id,
        model=requested_model(item.body),
        provider=target.provider_name,
        upstream_model=target.model,
        endpoint="chat",
        status=status,
        error=None if 200 <= status < 300 else "provider_batch_error",
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        cost_usd=(1.0 - discount) * cost_usd(target.price, prompt, completion, cached),
        attempts=1,
        client_request_id=item.custom_id if SAFE_ID.match(item.custom_id) else None,
        tags=principal.tags,
    )
