"""Daily spend budgets end to end, on the memory store and on a real Redis.

The bound under test is the one ``policies.quotas.manager`` states: the spend charged to
one UTC day is at most ``budget + sum over requests settled into it of max(0, actual -
estimate)``, where the estimate is what the gateway reserved before the call (prompt
characters / 4 + 4 per message at the input rate, ``max_tokens`` at the output rate).

- ``exact``: only output tokens are priced and ``max_tokens`` equals what the upstream
  produces, so estimates are exact: exactly ``floor(budget / cost)`` concurrent requests
  are served and the ledger's total never passes the budget.
- ``under``: long prompts are underestimated (m-count bills one token per character), so
  settles push the day past the budget, never by more than the underestimates add up to.

Requests beyond the budget get 429 with code ``insufficient_quota`` and leave no row.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from core.config_tenants import Price
from policies.auth import KeysFile
from policies.pricing import cost_usd, estimate_cost
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-spend-0123456789abcdef"
MAX_TOKENS = 5  # m-count always reports 5 completion tokens
EXACT = Price(input_per_mtok=0.0, output_per_mtok=1000.0)  # 0.005 USD per request
UNDER = Price(input_per_mtok=1000.0, output_per_mtok=1000.0)  # 0.001 USD per token
EXACT_BUDGET, UNDER_BUDGET = 0.1, 1.0
SENT = 60  # concurrent requests per tenant


@dataclass
class World:
    gateway: Gateway
    keys: dict[str, str]


def price_yaml(price: Price) -> str:
    return f"{{input_per_mtok: {price.input_per_mtok}, output_per_mtok: {price.output_per_mtok}}}"


@pytest.fixture(params=["memory", "redis"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("spend")
    keys_file = KeysFile(folder / "keys.json")
    keys = {t: keys_file.create(t, "spend")[0] for t in ("exact", "under")}
    state = "{backend: memory}"
    if request.param == "redis":
        # A generous command timeout: on a loaded machine a 0.25 s timeout sends the
        # tenants to their fail-open local limits, a second budget (this test is not about
        # outages; tests/hostile/test_store_faults.py is).
        url = request.getfixturevalue("redis_url")
        state = f'{{backend: redis, redis: {{url: "{url}", timeout_s: 5}}}}'
    with serve(FakeOpenAI()) as up:
        config = f"""
auth: {{admin_key_env: B_ADMIN, keys_file: {folder / "keys.json"}}}
state: {state}
tenants:
  exact: {{limits: {{usd_per_day: {EXACT_BUDGET}}}, models: [exact]}}
  under: {{limits: {{usd_per_day: {UNDER_BUDGET}}}, models: [under]}}
ledger: {{backend: sqlite, path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: B_OA}}
models:
  exact: {{targets: [{{provider: oa, model: m-count, price: {price_yaml(EXACT)}}}]}}
  under: {{targets: [{{provider: oa, model: m-count, price: {price_yaml(UNDER)}}}]}}
"""
        with running_gateway(config, {"B_ADMIN": ADMIN, "B_OA": "sk-upstream"}) as gateway:
            yield World(gateway, keys)


def body(model: str, text: str) -> dict[str, object]:
    return {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": text}],
    }


def estimate(price: Price, text: str) -> float:
    """What the gateway reserves for ``body(model, text)`` (see the module docstring)."""
    return estimate_cost(price, len(text) // 4 + 4, MAX_TOKENS)


def actual(price: Price, text: str) -> float:
    return cost_usd(price, len(text), MAX_TOKENS)


async def send_all(world: World, calls: list[tuple[str, str, str]]) -> list[httpx.Response]:
    """``calls`` are (tenant, model, text), all sent at once."""
    limits = httpx.Limits(max_connections=len(calls))
    async with httpx.AsyncClient(
        base_url=world.gateway.base_url, timeout=30.0, limits=limits
    ) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        "/chat/completions",
                        json=body(model, text),
                        headers={
                            "authorization": f"Bearer {world.keys[tenant]}",
                            "x-request-id": f"spend-{i}",
                        },
                    )
                    for i, (tenant, model, text) in enumerate(calls)
                )
            )
        )


def ledger(world: World) -> list[dict[str, Any]]:
    answer = httpx.get(
        world.gateway.url + "/admin/usage",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30.0,
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


def same_utc_day(needed_s: float = 30.0) -> None:
    """Budgets are per UTC day: do not let the run straddle midnight."""
    left = 86_400 - time.time() % 86_400
    if left < needed_s:
        time.sleep(left + 1.0)


def count_answers(
    calls: list[tuple[str, str, str]], answers: list[httpx.Response]
) -> dict[str, Counter[int]]:
    """Statuses per tenant; every answer is a 200 or a spend 429 (insufficient_quota)."""
    by_tenant: dict[str, Counter[int]] = {tenant: Counter() for tenant, _, _ in calls}
    for (tenant, _, _), answer in zip(calls, answers, strict=True):
        by_tenant[tenant][answer.status_code] += 1
        if answer.status_code == 429:
            error = answer.json()["error"]
            assert error["code"] == "insufficient_quota", error
            assert int(answer.headers["retry-after"]) >= 1
        else:
            assert answer.status_code == 200, answer.text
    return by_tenant


def assert_within_bound(served: list[dict[str, Any]], texts: dict[str, str]) -> None:
    """Each row costs what its usage says; the rows' total is at most the budget plus
    the sum of max(0, actual - estimate) over them."""
    for r in served:
        assert r["BilledCost"] == pytest.approx(actual(UNDER, texts[r["client_request_id"]]))
    committed = sum(r["BilledCost"] for r in served)
    excess = sum(
        max(0.0, actual(UNDER, text) - estimate(UNDER, text))
        for text in (texts[r["client_request_id"]] for r in served)
    )
    assert committed <= UNDER_BUDGET + excess + 1e-9, (committed, excess)


def test_spend_never_passes_the_documented_bound(world: World) -> None:
    same_utc_day()
    rng = random.Random(4)
    texts = {
        "exact": ["e" * rng.randint(1, 300) for _ in range(SENT)],
        "under": ["u" * rng.randint(40, 400) for _ in range(SENT)],
    }
    calls = [(tenant, tenant, text) for tenant in texts for text in texts[tenant]]
    rng.shuffle(calls)
    by_tenant = count_answers(calls, asyncio.run(send_all(world, calls)))

    rows = ledger(world)
    served = {t: [r for r in rows if r["SubAccountId"] == t] for t in texts}
    for tenant, counts in by_tenant.items():
        assert len(served[tenant]) == counts[200], tenant  # a 429 leaves no row
        assert counts[429] > 0, f"{tenant} never reached its budget"

    # Exact estimates: the budget buys exactly floor(budget / cost) requests, never more.
    assert by_tenant["exact"][200] == round(EXACT_BUDGET / actual(EXACT, ""))
    assert sum(r["BilledCost"] for r in served["exact"]) <= EXACT_BUDGET + 1e-9
    # Underestimates: over the budget by at most what they underestimated.
    assert_within_bound(served["under"], {f"spend-{i}": c[2] for i, c in enumerate(calls)})
