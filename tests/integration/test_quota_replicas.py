"""Tenant quotas across three real gateway processes sharing one real Redis.

- A concurrent burst of 3 x RPM requests spread over the three gateways: exactly RPM are
  served, the rest get 429 with Retry-After and x-ratelimit-remaining-requests: 0.
- Redis stopped mid-run: a tenant with ``on_store_failure: open`` keeps being served on
  each replica's local limits (RPM per replica), a ``closed`` tenant gets 503 with
  Retry-After, and nothing answers 500.
- Redis started again: within a few seconds every replica decides on Redis again (the
  fail-closed tenant is served, and a counter shared by all three replicas moves by one per
  request whichever replica takes it).

Counters live in fixed UTC minutes, so the parts that count requests run inside one minute
(``inside_one_minute`` waits for the next minute when too little of this one is left).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

RPM = 30  # the burst tenant's limit, shared by the three replicas
LOCAL_RPM = 4  # the fail-open tenant whose local limits are checked during the outage
BIG = 100_000


@dataclass
class Cluster:
    gateways: list[GatewayProcess]
    keys: dict[str, str]  # tenant -> API key
    redis: RedisServer

    def log(self) -> str:
        return "\n".join(g.log_path.read_text()[-1500:] for g in self.gateways)


@pytest.fixture
def cluster(tmp_path: Path, redis_server: RedisServer, redis_url: str) -> Iterator[Cluster]:
    keys_file = KeysFile(tmp_path / "keys.json")
    tenants = ("burst", "local", "loose", "strict")
    keys = {t: keys_file.create(t, "replicas")[0] for t in tenants}
    upstream = FakeOpenAI()
    with ExitStack() as stack:
        up = stack.enter_context(serve(upstream))
        config = tmp_path / "gateway.yaml"
        config.write_text(f"""
server: {{watch_config: false}}
logging: {{level: warning}}
state: {{backend: redis, redis: {{url: "{redis_url}", key_prefix: "replicas:"}}}}
auth: {{keys_file: {tmp_path / "keys.json"}}}
tenants:
  burst: {{limits: {{rpm: {RPM}}}}}
  local: {{limits: {{rpm: {LOCAL_RPM}}}, on_store_failure: open}}
  loose: {{limits: {{rpm: {BIG}}}, on_store_failure: open}}
  strict: {{limits: {{rpm: {BIG}}}, on_store_failure: closed}}
ledger: {{spool_path: {tmp_path / "spool.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: R_OA}}
models:
  count: {{targets: [{{provider: oa, model: m-count}}]}}
""")
        gateways = [
            GatewayProcess(config, {"R_OA": "sk-upstream"}, tmp_path / f"gateway{i}.log")
            for i in range(3)
        ]
        for gateway in gateways:
            stack.callback(gateway.kill)
        with ThreadPoolExecutor(len(gateways)) as pool:  # they import in parallel
            list(pool.map(GatewayProcess.start, gateways))
        yield Cluster(gateways, keys, redis_server)


def minute_of(ts: float) -> int:
    return int(ts // 60)


def inside_one_minute(needed_s: float) -> int:
    """Wait, if need be, until at least ``needed_s`` of the current UTC minute are left
    (then 1 s past the next minute's start); return that minute."""
    now = time.time()
    if 60 - now % 60 < needed_s:
        time.sleep(60 - now % 60 + 1.0)
    return minute_of(time.time())


async def burst(cluster: Cluster, tenant: str, per_gateway: int) -> list[httpx.Response]:
    """``per_gateway`` requests to each gateway, all at once."""
    headers = {"authorization": f"Bearer {cluster.keys[tenant]}"}
    body = {"model": "count", "messages": [{"role": "user", "content": "burst"}]}
    async with httpx.AsyncClient(timeout=30.0, headers=headers) as client:
        calls = [
            client.post(g.base_url + "/chat/completions", json=body)
            for _ in range(per_gateway)
            for g in cluster.gateways
        ]
        return list(await asyncio.gather(*calls))


def statuses(answers: list[httpx.Response]) -> Counter[int]:
    return Counter(a.status_code for a in answers)


def call(gateway: GatewayProcess, key: str) -> httpx.Response:
    body = {"model": "count", "messages": [{"role": "user", "content": "one"}]}
    return httpx.post(
        gateway.base_url + "/chat/completions",
        json=body,
        timeout=30.0,
        headers={"authorization": f"Bearer {key}"},
    )


def test_burst_outage_and_recovery(cluster: Cluster) -> None:
    minute = inside_one_minute(needed_s=20)

    answers = asyncio.run(burst(cluster, "burst", per_gateway=RPM))
    assert statuses(answers) == {200: RPM, 429: 2 * RPM}, cluster.log()
    for answer in answers:
        if answer.status_code == 429:
            assert int(answer.headers["retry-after"]) >= 1
            assert answer.headers["x-ratelimit-remaining-requests"] == "0"
            assert answer.json()["error"]["type"] == "rate_limit_error"

    cluster.redis.stop()
    outage = asyncio.run(burst(cluster, "local", per_gateway=LOCAL_RPM + 3))
    strict = asyncio.run(burst(cluster, "strict", per_gateway=3))
    loose = asyncio.run(burst(cluster, "loose", per_gateway=5))
    assert minute_of(time.time()) == minute, "the counted part outran its minute"
    # Fail open: each replica applies the limit on its own (so 3 x LOCAL_RPM in all).
    assert statuses(outage) == {200: 3 * LOCAL_RPM, 429: 9}, cluster.log()
    assert statuses(loose) == {200: 15}, cluster.log()
    assert statuses(strict) == {503: 9}, cluster.log()
    for answer in strict:
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.json()["error"]["type"]

    cluster.redis.start()
    assert_back_on_redis(cluster, within_s=10.0)


def assert_back_on_redis(cluster: Cluster, within_s: float) -> None:
    """Every replica serves the fail-closed tenant again (only Redis can decide for it),
    and one counter moves by exactly one per request across all three replicas."""
    deadline = time.monotonic() + within_s
    for gateway in cluster.gateways:
        while (status := call(gateway, cluster.keys["strict"]).status_code) != 200:
            assert status == 503, cluster.log()
            assert time.monotonic() < deadline, "a replica did not go back to Redis"
            time.sleep(0.1)
    for _ in range(3):  # a new minute resets the counter mid-sequence: try again
        start = minute_of(time.time())
        left = [
            int(call(g, cluster.keys["loose"]).headers["x-ratelimit-remaining-requests"])
            for g in cluster.gateways * 2
        ]
        if minute_of(time.time()) == start:
            break
    # Local limits would repeat values per replica; the shared counter never does.
    assert left == list(range(left[0], left[0] - 6, -1)), left
