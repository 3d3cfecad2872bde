"""One request's pass through the tenant and routing policies, shared by every endpoint.

Order (docs/architecture.md, "One request"): authenticate -> decode -> authorise the model
-> plan (filters and strategy; a request no target can serve fails here, before any quota
is touched) -> quota reserve -> [response cache] -> wait for capacity if every eligible
target is saturated -> execute -> settle the quota with real usage, commit the ledger row,
log.

Nothing is charged for a request that fails before its reservation (bad input, auth, 404,
quota); every request that was admitted leaves exactly one ledger row, also when it fails
upstream or the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import structlog
from litestar import Request, Response
from litestar.exceptions import InternalServerException

from core.config_tenants import TenantConfig
from core.errors import ClientClosedError, GatewayError, InvalidRequestError
from core.routing import RouteRequest
from core.wire import ChatRequest, RawResult
from gateway.http.abandon import SCOPE_KEY
from gateway.http.errors import internal_error
from gateway.process.health import TrackerObserver
from gateway.process.runtime import Runtime
from gateway.process.state import GatewayState
from gateway.request.batch import BATCH_PRIORITY, batch_caller, batch_route, no_room_for_batch
from gateway.request.routing_view import route_request, tenant_constraints
from gateway.telemetry.hub import Telemetry
from gateway.telemetry.record import RequestRecord
from policies.pricing import cost_usd, estimate_cost
from policies.quotas import Admission
from policies.sticky import stable_prefix_hash
from routers.planner import Plan, plan_route
from routers.sticky import prefer
from routers.streams import close_stream
from routers.targets import Skipped, Target
from routers.trace import Trace

_JSON = "application/json"
T = TypeVar("T")
P = TypeVar("P")
_rng = random.Random()
_log = structlog.get_logger("switchyard")
CLIENT_CLOSED = 499  # nginx's code: the client went away before the end


class Scope:
    """The policies' view of one request. Create it first; call ``close`` exactly once at
    the end (the handlers do it in ``finally`` blocks or at the end of a stream)."""

    def __init__(self, request: Request[Any, Any, Any], endpoint: str) -> None:
        self.state: GatewayState = request.app.state.gateway
        self.runtime: Runtime = self.state.runtime  # this request's snapshot, to the end
        self.record = RequestRecord(request, endpoint)
        self.headers: Mapping[str, str] = request.headers
        self.admission: Admission | None = None
        self.route: RouteRequest | None = None
        self.observer = TrackerObserver(self.state.trackers)
        self._candidates: tuple[list[Target], list[Skipped], ChatRequest | None] = ([], [], None)
        self._sticky_hash: str | None = None
        self._admitting: asyncio.Task[Admission] | None = None
        self._final: asyncio.Task[None] | None = None
        self._held: list[AsyncIterator[Any]] = []
        self.client_gone = False  # set by the edge when the client disconnects
        self.batch = batch_caller(request)  # set when the batch runner makes this request
        self.state.in_flight.enter(interactive=self.batch is None)
        self.record.priority = BATCH_PRIORITY if self.batch else 0
        self.telemetry: Telemetry = request.app.state.telemetry
        self.telemetry.started(self.record, self.headers, self.runtime.config)
        request.scope.setdefault("state", {})[SCOPE_KEY] = self  # for the edge's ``abandon``

    # -- before routing -------------------------------------------------------------------

    @staticmethod
    async def read_body(request: Request[Any, Any, Any]) -> bytes:
        """The request body; ``ClientClosedError`` (499) when the client left while it was
        being read (Litestar reports that as a 500, which would read as a bug)."""
        try:
            return await request.body()
        except InternalServerException as exc:
            raise ClientClosedError("The client closed the connection mid-request.") from exc

    def authenticate(self) -> None:
        """401 unless the credentials name a tenant (or the gateway is open)."""
        with self.record.timed("authenticate"):
            batch, auth = self.batch, self.runtime.auth  # a batch item: its batch's creator
            self.record.principal = batch.principal if batch else auth.authenticate(self.headers)

    def authorize(self, model: str) -> None:
        self.record.model = model
        self.runtime.auth.authorize_model(self.record.principal, model)

    @property
    def tenant(self) -> TenantConfig | None:
        return self.runtime.auth.tenant_config(self.record.principal)

    def plan_chat(self, req: ChatRequest) -> Plan:
        """Filters and strategy for a chat request (404 unknown alias, 400 no capable or
        fitting target)."""
        targets, skipped = self.runtime.plan_for(req.model)
        model = self.runtime.config.models[req.model]
        self.route = route_request(
            req,
            model,
            self.tenant,
            self.headers,
            tenant_name=self.record.principal.tenant,
            with_prefix=any(t.local for t in targets),
            max_n=self.runtime.config.routing.max_n,
        )
        self.route = batch_route(self.route, self.batch, targets)
        self._candidates = (targets, skipped, req)
        return self._plan(targets, skipped, req)

    def plan_other(
        self, model: str, kind: type, capability: str, prompt_tokens: int, max_tokens: int | None
    ) -> Plan:
        """Plan an embeddings or legacy-completions request: only targets whose adapter
        implements ``kind`` (400 when the alias has none)."""
        targets, skipped = self.runtime.plan_for(model)
        capable = [t for t in targets if isinstance(t.provider, kind)]
        if targets and not capable:
            raise InvalidRequestError(
                f"model '{model}' does not support {capability}",
                param="model",
                code="unsupported_endpoint",
            )
        self.route = RouteRequest(
            model=model,
            tenant=self.record.principal.tenant,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            **tenant_constraints(self.tenant),
        )
        self.route = batch_route(self.route, self.batch, capable)
        self._candidates = (capable, skipped, None)
        return self._plan(capable, skipped, None)

    async def wait_for_capacity(self, plan: Plan) -> Plan:
        """When every eligible target is a saturated local replica, wait in the admission
        queue (fair between tenants) until one can take the request or the deadline passes
        (429 queue full / 503 deadline, both with Retry-After)."""
        if plan.ordered or not plan.saturated:
            return plan
        if self.batch is not None:
            raise no_room_for_batch()
        current = plan

        def ready() -> bool:
            nonlocal current
            current = self._plan(*self._candidates)
            return bool(current.ordered)

        tenant = self.record.principal.tenant or ""
        with self.record.timed("queue.wait"):
            self.record.queue_s = await self.state.queue.wait(tenant, self._deadline_s(), ready)
        self.record.extra_headers["x-switchyard-queue-ms"] = f"{self.record.queue_s * 1000:.0f}"
        return current

    def _deadline_s(self) -> float:
        """Seconds a request may queue: its TTFT objective (header, tenant or alias),
        else the alias's queue deadline, else the queue's default."""
        route = self.route
        if route is not None and route.slo_ttft_ms is not None:
            return route.slo_ttft_ms / 1000.0
        model = self.runtime.config.models.get(self.record.model or "")
        if model is not None and model.queue_deadline_s is not None:
            return model.queue_deadline_s
        return self.runtime.config.routing.queue.deadline_s

    async def call(self, model: str, plan: Plan, call: Callable[[Target], Awaitable[T]]) -> T:
        """Run ``call`` on the plan's targets in order (fallback, retries, breakers)."""
        return await self.runtime.executor.call(
            model,
            plan.ordered,
            call,
            self.record.trace,
            observer=self.observer,
            gate=self.state.trackers.breakers.gate,
        )

    async def open_stream(
        self, model: str, plan: Plan, open_stream: Callable[[Target], AsyncIterator[P]]
    ) -> tuple[P, AsyncIterator[P]]:
        """The first part and the rest of the first target's stream that yields one, each
        target cut at its first-token deadline (``Plan.deadlines``, counted from the
        request's arrival)."""
        return await self.runtime.executor.open_stream(
            model,
            plan.ordered,
            open_stream,
            self.record.trace,
            observer=self.observer,
            gate=self.state.trackers.breakers.gate,
            deadlines=plan.deadlines,
            elapsed_s=self.record.elapsed_s(),
        )

    async def answer_raw(self, result: RawResult) -> Response[bytes]:
        """Close with the upstream's usage and answer its JSON body as it is."""
        self.record.usage = result.usage
        await self.close(200)
        return Response(result.body, media_type=_JSON, headers=self.record.headers())

    def use_provider_caches(self) -> None:
        """OpenAI ``prompt_cache_key`` per tenant; Anthropic ``cache_control`` placement."""
        settings = self.runtime.config.routing.prompt_cache
        tenant = self.record.principal.tenant
        if settings.openai_prompt_cache_key and tenant is not None:
            self.record.prompt_cache_key = f"switchyard-{tenant}"
        if settings.anthropic_cache_control:
            self.record.cache_control_min_chars = settings.min_cacheable_chars

    def _plan(self, targets: list[Target], skipped: list[Skipped], req: ChatRequest | None) -> Plan:
        assert self.route is not None
        self.observer.prompt_tokens = self.route.prompt_tokens  # feeds the TTFT-vs-prompt fit
        health = self.state.trackers.view(self.route)
        strategy = self.runtime.strategies[self.route.model]
        plan = plan_route(self.route, targets, health, strategy, _rng, req)
        self.record.trace = Trace.from_plan(plan, skipped)
        return plan

    async def admit(self, plan: Plan, est_prompt: int, est_output: int) -> None:
        """Reserve quota for the estimate (429 with x-ratelimit-* / 503 when the store is
        down and the tenant fails closed)."""
        first = plan.ordered[0] if plan.ordered else None
        cost = estimate_cost(first.price if first else None, est_prompt, est_output)
        quotas, principal = self.runtime.quotas, self.record.principal
        admit = quotas.admit(principal, est_prompt + est_output, cost, self.record.request_id)
        with self.record.timed("quota.admit"):
            await self._admit(admit)
        assert self.admission is not None
        self.record.extra_headers.update(self.admission.headers())

    async def _admit(self, admit: Coroutine[Any, Any, Admission]) -> None:
        if self.runtime.quotas.admits_without_io(self.record.principal):
            # Nothing to await on (no limits, or the memory store): a cancellation can only
            # land after the admission is recorded, so no task is needed.
            self.admission = await admit
        else:
            # Shielded: a client that leaves while the store answers must not orphan a
            # reservation that was made; ``close`` settles it.
            self._admitting = asyncio.create_task(admit)
            self.admission = await asyncio.shield(self._admitting)

    async def prefer_sticky(self, plan: Plan, req: ChatRequest) -> None:
        """Move the managed target whose prompt cache already holds this tenant's stable
        prefix (system prompt, tools) to the front of the plan."""
        tenant = self.record.principal.tenant
        settings = self.runtime.config.routing.prompt_cache
        if tenant is None or len(plan.ordered) < 2:
            return
        self._sticky_hash = stable_prefix_hash(req, settings.min_cacheable_chars)
        if self._sticky_hash is None:
            return
        label = await self.state.sticky.lookup(tenant, self._sticky_hash)
        if label is not None:
            plan.ordered, reason = prefer(plan.ordered, label)
            if reason:
                self.record.trace.reasons[label] = reason

    # -- after ----------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> tuple[int, GatewayError | None]:
        """The status and error a request that raised ``exc`` ends with: the error's own
        status, 499 when the request was cancelled (the client left or the server is
        shutting down), 500 for anything else (a bug: logged with its traceback)."""
        if isinstance(exc, GatewayError):
            exc.headers.update(self.record.extra_headers)
            return exc.status, exc
        if isinstance(exc, Exception):
            _log.error("request.failed", request_id=self.record.request_id, exc_info=exc)
            return 500, internal_error()
        return CLIENT_CLOSED, None

    def hold(self, stream: AsyncIterator[Any]) -> None:
        """Register an upstream stream (or the SSE body) that ``abandon`` must close if the
        server never runs the body to its end (a client that left before it started)."""
        self._held.append(stream)

    async def abandon(self) -> None:
        """Called by the edge after the response was sent or given up on: close what is
        still open (the body generator's own cleanup closes the scope) and end the request
        as 499 if nothing else did. Idempotent."""
        for stream in reversed(self._held):
            with contextlib.suppress(Exception):
                await close_stream(stream)
        self._held.clear()
        await self.close(CLIENT_CLOSED)

    async def close(self, status: int, error: GatewayError | None = None) -> None:
        """Settle the quota with real usage, commit the ledger row (a request that was
        never admitted has neither), write the log line. Idempotent: the first call's
        status counts.

        The work runs in one task of its own, created before this method first awaits and
        tracked by the state (shutdown waits for it): a request cancelled at any await
        (client gone, server shutting down) still releases what admission took and writes
        its row, on every store backend. Cancelling the caller does not cancel the task."""
        if self._final is None:
            self._final = self.state.track(self._finish(status, error))
        await asyncio.shield(self._final)

    async def _finish(self, status: int, error: GatewayError | None) -> None:
        record = self.record
        try:
            admission = await self._admitted()
            if admission is not None:
                if self.route is not None:
                    record.estimate_cut_usage(self.route.prompt_tokens)
                record.cost_usd = self._cost()
                record.hedge_cost_usd = self._hedge_cost()
                usage = record.usage
                tokens = usage.total_tokens if usage and not record.cache_hit else 0
                await self.runtime.quotas.settle(admission, tokens, record.cost_usd)
                row = record.usage_row(status, error, self.state.clock.wall())
                with record.timed("ledger.commit"):
                    await self.state.ledger.append(row)
                self._learn(status)
        except Exception:
            _log.exception("request.finish_failed", request_id=record.request_id)
            raise
        finally:
            self.observer.release()
            self.state.queue.notify()
            self._count_goodput(status)
            record.finish(status, error)
            self.telemetry.finished(record, self.runtime.config, status, error)
            self.state.in_flight.leave(interactive=self.batch is None)

    def _count_goodput(self, status: int) -> None:
        record = self.record
        if self.route is None:
            return  # never routed (refused before): not a request for any alias's goodput
        record.slo_ttft_ms = self.route.slo_ttft_ms
        # A JSON answer's first token reaches the client with the whole answer.
        first = record.ttft_s if record.stream else record.elapsed_s()
        record.slo_met = self.state.goodput.record(
            self.route.model, objective_ms=record.slo_ttft_ms, ttft_s=first, ok=status == 200
        )

    async def _admitted(self) -> Admission | None:
        """The admission, also when the request was cancelled while the store answered
        (the reservation may have been made: it must be settled like any other)."""
        if self.admission is None and self._admitting is not None:
            try:
                self.admission = await self._admitting
            except GatewayError:
                return None  # refused: nothing was reserved
        return self.admission

    def _cost(self) -> float:
        served, usage = self.record.trace.served_by, self.record.usage
        if served is None or usage is None or self.record.cache_hit:
            return 0.0
        discount = self.runtime.config.batch.discount if self.batch else 0.0  # batch price
        return (1.0 - discount) * cost_usd(
            served.price, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        )

    def _hedge_cost(self) -> float:
        """What the hedge race's loser likely cost (its prompt at its price: managed APIs
        bill a cancelled request's prompt): the operator's, not the tenant's."""
        loser, usage = self.record.trace.hedge_loser, self.record.usage
        if loser is None or usage is None:
            return 0.0
        return cost_usd(loser.price, usage.prompt_tokens, 0)

    def _learn(self, status: int) -> None:
        """Feed what this request showed back to the trackers (tokens per second, and where
        its prefix now lives)."""
        served, usage, route = self.record.trace.served_by, self.record.usage, self.route
        if served is None or status != 200:
            return
        if usage is not None and usage.completion_tokens > 1 and self.record.ttft_s is not None:
            decode_s = self.record.elapsed_s() - self.record.ttft_s
            self.state.trackers.latency.observe_tokens(
                served.label, usage.completion_tokens - 1, decode_s
            )
        index = self.state.trackers.capacity.prefix_index
        if route is not None and route.prefix_hashes and served.local and index is not None:
            index.record(served.label, route.prefix_hashes)
        tenant = self.record.principal.tenant
        if self._sticky_hash is not None and tenant is not None and not served.local:
            self.state.spawn(self.state.sticky.remember(tenant, self._sticky_hash, served.label))


def body_tokens(raw: bytes) -> int:
    """Prompt tokens of a request no tokenizer has seen, roughly (bytes / 4)."""
    return len(raw) // 4
