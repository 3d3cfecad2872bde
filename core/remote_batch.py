"""What a provider's own batch API reports, in the gateway's terms (docs/batches.md,
"Through the provider's batch API"): the state of a submitted batch and one result per
request. The provider-side clients (``providers.openai.batch_api``,
``providers.anthropic.batch_api``) produce these; the gateway's provider-batch loop reads
them. Pure data, no I/O."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from core.wire import Usage

RemoteState = Literal["running", "ended", "failed"]


class RemoteStatus(Struct, frozen=True, kw_only=True):
    """Where a submitted batch stands.

    - ``state``: ``running`` (poll again), ``ended`` (results can be read: completed,
      cancelled or expired upstream, some requests may have none) or ``failed`` (the
      provider refused the batch as a whole: no request ran; ``code``/``message`` say why).
    - ``status``: the provider's own word (``in_progress``, ``ended``, ``expired``, ...).
    """

    state: RemoteState
    status: str
    code: str | None = None
    message: str | None = None


class RemoteResult(Struct, frozen=True, kw_only=True):
    """One request's outcome. Answered (``status_code`` set): ``body`` is the answer as
    OpenAI's ``/v1/chat/completions`` would write it (a chat completion, or OpenAI's error
    shape for a non-2xx) and ``usage`` its tokens. Never answered (``status_code`` None):
    ``error_code``/``error_message`` say why (``batch_expired``, ``batch_cancelled``, ...)."""

    status_code: int | None = None
    body: bytes = b""
    usage: Usage | None = None
    error_code: str | None = None
    error_message: str | None = None
