"""OpenAI ``reasoning_effort`` -> Anthropic extended thinking (pure).

Budgets per effort (``budget_tokens``; Anthropic's minimum is 1024): minimal and low 1024,
medium 4096, high 16384. ``none`` (or no effort) sends no ``thinking`` at all, which is
Anthropic's default: no thinking.

``max_tokens`` counts thinking and answer together, and the budget must stay below it:

- without a client limit, the configured default is the answer's room and the budget comes on
  top of it (``max_tokens = default + budget``);
- with a client limit, that limit caps both, as OpenAI's ``max_completion_tokens`` (which
  counts reasoning tokens), the Responses API's ``max_output_tokens`` and Anthropic's own
  ``max_tokens`` all do: thinking gets at most half of it, so the answer keeps the other
  half. Below 2048 the budget stays at Anthropic's minimum of 1024 and ``max_tokens`` is
  raised to 1025 when the limit is smaller (the only way to think at all).

Thinking is left off, whatever the effort, when Anthropic would reject it:

- the request forces a tool (``tool_choice`` any/tool, which json_schema mode uses):
  "Thinking may not be enabled when tool_choice forces tool use";
- the last assistant turn called tools: while a tool loop runs, Anthropic wants that turn to
  start with its signed ``thinking`` block, and the canonical form keeps no signatures (see
  ``providers.anthropic.convert``), so the loop continues without thinking.

With thinking on, Anthropic accepts no ``temperature`` other than 1, no ``top_k``, and a
``top_p`` only between 0.95 and 1: those are dropped or raised to 0.95 (the effort is the
client's explicit ask; the sampling knobs are usually defaults of its SDK).
"""

from __future__ import annotations

import msgspec

from core.wire import ReasoningEffort
from providers.anthropic import wire

MIN_BUDGET = 1024
MIN_TOP_P = 0.95
BUDGETS: dict[ReasoningEffort, int] = {
    "minimal": MIN_BUDGET,
    "low": MIN_BUDGET,
    "medium": 4096,
    "high": 16384,
}


def thinking_budget(effort: ReasoningEffort | None) -> int | None:
    """The ``budget_tokens`` for ``effort``; None for no effort and for ``none``."""
    return BUDGETS.get(effort) if effort is not None else None


def plan_tokens(budget: int, client_limit: int | None, default_max_tokens: int) -> tuple[int, int]:
    """(budget_tokens, max_tokens) for a thinking call; see the module docstring."""
    if client_limit is None:
        return budget, default_max_tokens + budget
    budget = max(MIN_BUDGET, min(budget, client_limit // 2))
    return budget, max(client_limit, budget + 1)


def apply_thinking(
    body: wire.MessagesRequest,
    effort: ReasoningEffort | None,
    client_limit: int | None,
    default_max_tokens: int,
) -> wire.MessagesRequest:
    """``body`` with thinking enabled for ``effort`` (and the limits it needs), or ``body``
    itself when there is no effort, it is ``none``, or Anthropic would refuse thinking."""
    budget = thinking_budget(effort)
    if budget is None or _forces_tool(body) or _tool_loop_open(body):
        return body
    budget, max_tokens = plan_tokens(budget, client_limit, default_max_tokens)
    top_p = None if body.top_p is None else max(body.top_p, MIN_TOP_P)
    return msgspec.structs.replace(
        body,
        thinking=wire.ThinkingParam(budget_tokens=budget),
        max_tokens=max_tokens,
        temperature=None,
        top_k=None,
        top_p=top_p,
    )


def _forces_tool(body: wire.MessagesRequest) -> bool:
    return body.tool_choice is not None and body.tool_choice.type in ("any", "tool")


def _tool_loop_open(body: wire.MessagesRequest) -> bool:
    """The last assistant turn holds a ``tool_use`` block (its signed thinking is lost)."""
    for turn in reversed(body.messages):
        if turn.role == "assistant":
            return any(isinstance(block, wire.ToolUseBlock) for block in turn.content)
    return False
