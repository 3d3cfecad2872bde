"""Chained block hashes of a prompt, for prefix-aware routing (pure, no I/O).

The router cannot see a worker's tokens, so it approximates the worker's KV blocks with
fixed-size *character* blocks of a canonical prompt text: ``block_chars=64`` is about 16
tokens (about 4 characters per token), vLLM's default block size. Like vLLM's block hashes
they are chained: hash ``i`` covers blocks ``0..i``, so two prompts share their first ``k``
hashes exactly when their first ``k`` blocks are equal (up to 64-bit collisions).

Hashes are BLAKE2b (8-byte digests, unsigned ints), stable across processes and replicas,
unlike Python's salted ``hash``. Only full blocks are hashed: a partial tail block is not
reusable on the worker either.

``prompt_text`` writes a request the way it leads the upstream prompt: tool definitions
first (chat templates put them into the system turn), then every message's role and text in
order. Two requests with the same leading messages therefore share their leading hashes, and
a conversation that grows turn by turn keeps the hashes of its earlier turns.
"""

from __future__ import annotations

import hashlib
import json

import msgspec

from core.routing import PREFIX_BLOCK_CHARS
from core.wire import ChatRequest, Message, TextPart, Tool

# Separators that do not occur in ordinary text, so "ab" + "c" and "a" + "bc" differ.
_FIELD = "\x1f"
_RECORD = "\x1e"


def prefix_hashes(
    text: str, block_chars: int = PREFIX_BLOCK_CHARS, max_blocks: int = 256
) -> tuple[int, ...]:
    """Chained hashes of the full ``block_chars``-character blocks of ``text``, oldest first.

    At most ``max_blocks`` hashes (the leading ones): a prompt longer than that is hashed
    only as far as routing needs. Raises ``ValueError`` for a non-positive ``block_chars``.
    """
    if block_chars <= 0:
        raise ValueError("block_chars must be positive")
    count = min(len(text) // block_chars, max(0, max_blocks))
    if count == 0:
        return ()
    running = hashlib.blake2b(digest_size=8)
    out: list[int] = []
    for start in range(0, count * block_chars, block_chars):
        # One running hasher over the whole prefix: each digest depends on every earlier
        # block, which is what chaining buys, at one update per block.
        running.update(text[start : start + block_chars].encode("utf-8", "surrogatepass"))
        out.append(int.from_bytes(running.copy().digest(), "big"))
    return tuple(out)


def _tool_text(tool: Tool) -> str:
    fn = tool.function
    # sort_keys: the same schema written in another key order is the same prefix to us.
    params = json.dumps(fn.parameters, sort_keys=True, separators=(",", ":"))
    return f"tool{_FIELD}{fn.name}{_FIELD}{fn.description or ''}{_FIELD}{params}"


def _content_text(message: Message) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for part in content:
        if isinstance(part, TextPart):
            pieces.append(part.text)
        else:
            # Non-text parts change the upstream prompt too; a short digest stands for them
            # so a large inline image does not turn into hundreds of blocks of base64.
            raw = msgspec.json.encode(part, order="deterministic")
            digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
            pieces.append(f"[{type(part).__name__}:{digest}]")
    return "".join(pieces)


def _message_text(message: Message) -> str:
    text = f"{message.role}{_FIELD}{message.name or ''}{_FIELD}{_content_text(message)}"
    if message.tool_calls:
        calls = "".join(
            f"{_FIELD}{call.id}{_FIELD}{call.function.name}{_FIELD}{call.function.arguments}"
            for call in message.tool_calls
        )
        text += calls
    if message.tool_call_id:
        text += f"{_FIELD}{message.tool_call_id}"
    return text


def prompt_text(req: ChatRequest) -> str:
    """A canonical text of what leads the upstream prompt: tools, then messages in order.

    Sampling parameters and the model name are left out: they do not change the prompt's
    KV cache. Deterministic for equal requests; a shared leading part of two requests gives a
    shared leading part of their texts.
    """
    records = [_tool_text(tool) for tool in req.tools or ()]
    records.extend(_message_text(message) for message in req.messages)
    return _RECORD.join(records) + _RECORD
