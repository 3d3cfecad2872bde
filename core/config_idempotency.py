"""Policy-file section ``idempotency``: how the gateway treats an ``Idempotency-Key`` header
on chat, completions, responses, messages and embeddings (docs/idempotency.md)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]


class IdempotencyConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Read per request from the current runtime, so a reload applies to the next request.

    - ``enabled``: False ignores the header (every request runs, as without it).
    - ``ttl_s``: how long a stored answer is replayed to retries with the same key.
    - ``wait_s``: how long a retry waits for the first request with its key to finish
      before it gets a 409 (the first keeps running).
    - ``claim_ttl_s``: the lease of a running request on its key; the replica running it
      renews it every third of this, so a key whose replica died frees after this long.
    - ``max_response_bytes``: answers larger than this are not stored (the key is freed
      and a retry runs again); bounds the store's memory per key.
    """

    enabled: bool = True
    ttl_s: PositiveFloat = 86_400.0
    wait_s: PositiveFloat = 120.0
    claim_ttl_s: PositiveFloat = 30.0
    max_response_bytes: PositiveInt = 4 * 1024 * 1024
