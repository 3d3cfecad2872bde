"""The routing promise over real HTTP: a gateway in front of fake OpenAI upstreams that hang,
start late or queue beyond a fixed number of slots (``tests/fixtures/fake_slow_openai``).

- Deadline-aware fallback: a request with a TTFT objective leaves a hanging target at its
  first-token deadline, long before the target's first-token timeout; one without an
  objective waits for that timeout. Cuts open no breaker; they raise the latency estimate.
- Goodput: ``GET /admin/goodput`` and the ``request.completed`` log line count objectives
  met and missed; requests refused before routing do not count.
- Load-aware routing without a metrics feed: the ``slo`` strategy learns how a cheap
  target's TTFT grows with the requests the gateway holds there, and a later burst spills
  over to the dearer target instead of queueing deep on the cheap one.
- The ``slo`` strategy's ``default_ttft_ms`` steers requests that set no objective.
- The same deadline behaviour with shared state on a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import structlog

from core.config import LoggingConfig
from gateway.process.observe import configure_logging
from tests.fixtures.fake_slow_openai import SlowOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-promise-0123456789"
SLO = "x-switchyard-slo-ttft-ms"
REASON = "x-switchyard-route-reason"
SERVED = "x-switchyard-upstream-model"
HOLD_S = 0.3  # each request holds one of m-queue's 2 slots this long before answering
CHEAP, FAST = "patient/m-queue", "patient/m-fast"


def config_text(up: str, state: str = "") -> str:
    # One attempt per target (no retry muddles what happened to a target). The breaker
    # opens on the first failure: one cut attempt would open it if cuts counted as
    # failures (a first-token timeout does open it).
    return f"""
{state}
auth: {{admin_key_env: T_ADMIN}}
routing:
  max_attempts_per_target: 1
  breaker: {{consecutive_failures: 1, min_calls: 1, failure_rate: 1.0, window_s: 60,
            cooldown_s: 60}}
providers:
  patient: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA, first_token_timeout_s: 20}}
  impatient: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA,
              first_token_timeout_s: 1.5}}
models:
  deadline:
    targets: [{{provider: patient, model: m-hang}}, {{provider: patient, model: m-backup}}]
  deadline-again:
    targets: [{{provider: patient, model: m-hang-again}},
              {{provider: patient, model: m-backup-again}}]
  no-objective:
    targets: [{{provider: impatient, model: m-hang-too}},
              {{provider: impatient, model: m-backup-too}}]
  paced: {{targets: [{{provider: patient, model: m-paced}}]}}
  load:
    # default_reserve null: the warm-up's requests without an objective may queue on
    # m-queue (that is how the curve learns its queue here; by default they leave its last
    # slot free once the queue shows, and spill to m-fast).
    strategy: {{type: slo, default_reserve: null}}
    targets:
      - {{provider: patient, model: m-queue, price: {{input_per_mtok: 0.1, output_per_mtok: 0.4}}}}
      - {{provider: patient, model: m-fast, price: {{input_per_mtok: 5, output_per_mtok: 15}}}}
  defaulted:
    strategy: {{type: slo, default_ttft_ms: 4000}}
    targets:
      - {{provider: patient, model: m-cheap-d, price: {{input_per_mtok: 0.1, output_per_mtok: 0.4}}}}
      - {{provider: patient, model: m-dear-d, price: {{input_per_mtok: 5, output_per_mtok: 15}}}}
"""


ENV = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}


def slow_upstream() -> SlowOpenAI:
    app = SlowOpenAI()
    app.hanging |= {"m-hang", "m-hang-too", "m-hang-again"}
    app.delays["m-paced"] = 0.05
    app.slots["m-queue"] = (2, HOLD_S)
    return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[SlowOpenAI]:
    app = slow_upstream()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture(scope="module")
def gateway(upstream: SlowOpenAI) -> Iterator[Gateway]:
    with running_gateway(config_text(upstream.url), ENV) as gw:  # type: ignore[attr-defined]
        yield gw


# -- helpers ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    text: str
    elapsed_s: float

    @property
    def served(self) -> str | None:
        return self.headers.get(SERVED)

    @property
    def reason(self) -> str:
        return self.headers.get(REASON, "")


def body_for(alias: str, stream: bool) -> dict[str, Any]:
    return {"model": alias, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def streamed_text(raw: str) -> str:
    """The concatenated ``delta.content`` of an SSE chat stream."""
    pieces = []
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            pieces.append(choice.get("delta", {}).get("content") or "")
    return "".join(pieces)


async def stream_chat(
    client: httpx.AsyncClient, alias: str, headers: dict[str, str] | None = None
) -> Answer:
    started = time.monotonic()
    async with client.stream(
        "POST", "/v1/chat/completions", json=body_for(alias, True), headers=headers
    ) as response:
        raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    return Answer(response.status_code, response.headers, raw.decode(), time.monotonic() - started)


def stream_once(gateway: Gateway, alias: str, headers: dict[str, str] | None = None) -> Answer:
    async def one() -> Answer:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            return await stream_chat(client, alias, headers)

    return asyncio.run(one())


def admin_get(gateway: Gateway, path: str) -> dict[str, Any]:
    answer = httpx.get(gateway.url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def target(gateway: Gateway, label: str) -> dict[str, Any]:
    found = [t for t in admin_get(gateway, "/admin/targets")["targets"] if t["target"] == label]
    assert len(found) == 1, label
    return found[0]


def wait_until(check: Any, limit_s: float = 5.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- 1. deadline-aware fallback --------------------------------------------------------


def check_deadline_fallback(gateway: Gateway, upstream: SlowOpenAI) -> None:
    """A streamed request with a 1.5 s TTFT objective leaves the hanging first target at
    its deadline (its first-token timeout is 20 s) and is served by the second. The cut
    does not open the hanging target's breaker (one failure would), it lets go of the
    target, and the target's TTFT estimate is at least the wait."""
    answer = stream_once(gateway, "deadline", {SLO: "1500"})
    assert answer.status == 200, answer.text
    assert answer.served == "m-backup"
    assert "fallback after patient/m-hang failed" in answer.reason, answer.reason
    assert answer.headers["x-switchyard-attempts"] == "2"
    assert streamed_text(answer.text) == "Hello from openai!"
    # Which path was taken: the deadline (1.5 s), not the first-token timeout (20 s).
    assert answer.elapsed_s < 8, answer.elapsed_s
    assert upstream.hung["m-hang"] == 1
    assert wait_until(lambda: upstream.released["m-hang"] == 1), "the cut left no disconnect"

    hanging = target(gateway, "patient/m-hang")
    assert hanging["breaker"] == "closed", hanging
    # A cut is no sample (its TTFT is unknown, only more than the wait): it leaves a
    # penalty on the target's predictions and, never measured, a floor at the wait.
    assert hanging["ttft_s"] is None and hanging["ttft_base_s"] is None, hanging
    assert hanging["ttft_penalty"] > 1.9 and hanging["ttft_floor_s"] > 1.4, hanging
    assert hanging["in_flight"] == 0, hanging  # the cut attempt let go of the target
    assert target(gateway, "patient/m-backup")["breaker"] == "closed"


def test_deadline_cuts_a_hanging_target_for_requests_with_an_objective(
    gateway: Gateway, upstream: SlowOpenAI
) -> None:
    check_deadline_fallback(gateway, upstream)


def test_without_an_objective_the_first_token_timeout_applies(
    gateway: Gateway, upstream: SlowOpenAI
) -> None:
    """Same shape, no objective, an unmeasured first target: the request waits the full
    1.5 s first-token timeout before falling back; a timeout is a failure (the breaker
    opens), not a latency sample."""
    answer = stream_once(gateway, "no-objective")
    assert answer.status == 200, answer.text
    assert answer.served == "m-backup-too"
    assert "fallback after impatient/m-hang-too failed" in answer.reason, answer.reason
    assert answer.elapsed_s >= 1.45, answer.elapsed_s  # it waited for the timeout
    assert upstream.hung["m-hang-too"] == 1
    timed_out = target(gateway, "impatient/m-hang-too")
    assert timed_out["ttft_s"] is None, timed_out
    # The contrast with the cut above: a first-token timeout is a failure.
    assert timed_out["breaker"] == "open", timed_out


def test_a_second_request_with_an_objective_is_not_held_by_a_known_hanging_target(
    gateway: Gateway, upstream: SlowOpenAI
) -> None:
    """After one cut the hanging target carries a cut penalty (not a measurement: its
    patience stays unknown) and the backup is measured (a few ms): a request with a 500 ms
    objective leaves the hanging target by ~0.5 s instead of waiting longer each time."""
    first = stream_once(gateway, "deadline-again", {SLO: "1500"})
    assert first.status == 200 and first.served == "m-backup-again", first.reason
    second = stream_once(gateway, "deadline-again", {SLO: "500"})
    assert second.status == 200 and second.served == "m-backup-again", second.reason
    assert upstream.hung["m-hang-again"] == 2
    # Generous: the objective is 0.5 s (a stand-in sample in the fits made it 4.5 s).
    assert second.elapsed_s < 2.5, second.elapsed_s


# -- 2. goodput ------------------------------------------------------------------------


def test_goodput_counts_objectives_met_and_missed(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging(LoggingConfig(level="info", json=True), cache=False)
    try:
        ids = send_goodput_mix(gateway)
    finally:
        structlog.reset_defaults()
    out = capsys.readouterr().out
    lines = {}
    for line in out.splitlines():
        if '"request.completed"' in line:
            entry = json.loads(line)
            lines[entry["request_id"]] = entry
    seen = [(lines[i]["status"], lines[i]["slo_ttft_ms"], lines[i]["slo_met"]) for i in ids]
    assert seen == [
        (200, 60000.0, True),
        (200, 60000.0, True),
        (200, 1.0, False),
        (200, None, None),
        (400, None, None),
        (400, None, None),
    ]

    report = admin_get(gateway, "/admin/goodput")
    assert report["window_s"] == 60
    paced = report["models"]["paced"]
    assert paced == {
        "window_s": 60,
        "requests": 4,
        "with_objective": 3,
        "met": 2,
        "goodput_per_s": pytest.approx(2 / 60),
        "attainment": pytest.approx(2 / 3),
    }


def send_goodput_mix(gateway: Gateway) -> list[str]:
    """Against m-paced (first chunk after 50 ms): two streams with a 60 s objective (met),
    one with 1 ms (missed), one unstreamed without objective, then two refused before
    routing (a body that is not a chat request, an objective that is not a number)."""
    ids = []
    for value in ("60000", "60000", "1"):
        answer = stream_once(gateway, "paced", {SLO: value})
        assert answer.status == 200, answer.text
        ids.append(answer.headers["x-request-id"])
    plain = httpx.post(gateway.base_url + "/chat/completions", json=body_for("paced", False))
    assert plain.status_code == 200, plain.text
    ids.append(plain.headers["x-request-id"])
    invalid = httpx.post(
        gateway.base_url + "/chat/completions", json={"model": "paced", "messages": "nope"}
    )
    assert invalid.status_code == 400, invalid.text
    ids.append(invalid.headers["x-request-id"])
    bad_header = httpx.post(
        gateway.base_url + "/chat/completions",
        json=body_for("paced", False),
        headers={SLO: "soon"},
    )
    assert bad_header.status_code == 400, bad_header.text
    assert bad_header.json()["error"]["param"] == SLO
    ids.append(bad_header.headers["x-request-id"])
    return ids


# -- 3. load-aware routing -------------------------------------------------------------


@dataclass
class Burst:
    answers: list[Answer]
    peak_in_flight: int  # the most ``GET /admin/targets`` showed at the cheap target
    peak_factor: float  # the cheap target's highest ``ttft_load_factor`` seen meanwhile


async def burst(gateway: Gateway, size: int, headers: dict[str, str] | None) -> Burst:
    """``size`` concurrent streamed requests to ``load``, with ``GET /admin/targets``
    polled meanwhile."""
    result = Burst([], 0, 0.0)
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=size + 2)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, limits=limits) as client:

        async def poll() -> None:
            while not done.is_set():
                answer = await client.get(
                    "/admin/targets", headers={"authorization": f"Bearer {ADMIN}"}
                )
                for entry in answer.json()["targets"]:
                    if entry["target"] == CHEAP:
                        result.peak_in_flight = max(result.peak_in_flight, entry["in_flight"])
                        result.peak_factor = max(result.peak_factor, entry["ttft_load_factor"])
                await asyncio.sleep(0.03)

        poller = asyncio.create_task(poll())
        requests = (stream_chat(client, "load", headers) for _ in range(size))
        result.answers = list(await asyncio.gather(*requests))
        done.set()
        await poller
    return result


def test_slo_routing_spills_over_when_the_cheap_target_queues(
    gateway: Gateway, upstream: SlowOpenAI
) -> None:
    """No metrics feed: the gateway learns the cheap target's TTFT-vs-in-flight curve from
    its own counts, and stops sending it requests it would queue past the objective."""
    # One request measures the cheap target (an unmeasured target is explored by one
    # request at a time: a burst at cold start would spread over both).
    assert asyncio.run(burst(gateway, 1, None)).answers[0].served == "m-queue"
    # Warm-up: 8 at once, four times, no objective (the default 5 s one steers them): all
    # go to the cheap target, which serves 2 at a time, so their TTFTs are 0.3, 0.3, 0.6
    # ... 1.2 s. (The curve counts a band's slow-down only beyond one standard error, and
    # a band's first samples carry the prior's: with two bursts it learns too little of
    # the queue, and the no-load fit takes the rest as its own.)
    for _ in range(3):
        assert {a.served for a in asyncio.run(burst(gateway, 8, None)).answers} == {"m-queue"}
    warm = asyncio.run(burst(gateway, 8, None))
    assert [a.status for a in warm.answers] == [200] * 8
    assert {a.served for a in warm.answers} == {"m-queue"}, [a.reason for a in warm.answers]
    assert upstream.max_active["m-queue"] >= 6, dict(upstream.max_active)
    assert warm.peak_in_flight >= 2, warm  # /admin/targets saw them in flight
    learnt = target(gateway, CHEAP)
    assert learnt["in_flight"] == 0 and learnt["ttft_load_factor"] == 1.0, learnt
    assert learnt["ttft_base_s"] is not None and learnt["ttft_base_s"] < 1.0, learnt

    # The burst: 12 at once with a 1 s objective, which the cheap target meets with a
    # couple in flight (its no-load estimate, ~0.4 s, is well within it) but not 6 deep.
    upstream.reset_peaks()
    spread = asyncio.run(burst(gateway, 12, {SLO: "1000"}))
    answers = spread.answers
    described = [(a.served, a.reason) for a in answers]
    assert [a.status for a in answers] == [200] * 12, described
    on_cheap = [a for a in answers if a.served == "m-queue"]
    on_fast = [a for a in answers if a.served == "m-fast"]
    assert len(on_cheap) + len(on_fast) == 12, described
    assert on_cheap, f"the cheap target got nothing, though it had free slots: {described}"
    # 2 slots of 0.3 s: the 7th request in line would start after 1.2 s, so about six
    # fit in the objective; the rest must go to the fast target.
    assert len(on_fast) >= 4, described
    # The fake's own count: the cheap upstream never held many more than fit.
    assert upstream.max_active["m-queue"] <= 7, dict(upstream.max_active)
    for answer in on_cheap:
        assert answer.reason.startswith("slo: cheapest meeting ttft<=1000ms"), answer.reason
    # What kept the rest off it: the load factor for what it held, not its no-load TTFT.
    # (Shrunk by one standard error of what the warm-up taught: ~1.5 where 2 is the truth.)
    assert spread.peak_factor > 1.3, spread.peak_factor
    assert target(gateway, CHEAP)["in_flight"] == 0
    assert target(gateway, FAST)["in_flight"] == 0


# -- 4. default objective --------------------------------------------------------------


def test_default_objective_steers_requests_without_one(gateway: Gateway) -> None:
    plain = stream_once(gateway, "defaulted")
    assert plain.status == 200, plain.text
    assert plain.served == "m-cheap-d"
    assert "default ttft<=4000ms" in plain.reason, plain.reason
    asked = stream_once(gateway, "defaulted", {SLO: "3000"})
    assert asked.status == 200, asked.text
    assert "ttft<=3000ms" in asked.reason and "default" not in asked.reason, asked.reason
    # Only the client's own objective counts for goodput.
    counts = admin_get(gateway, "/admin/goodput")["models"]["defaulted"]
    assert (counts["requests"], counts["with_objective"], counts["met"]) == (2, 1, 1)


# -- 5. the same on a real Redis --------------------------------------------------------


def test_deadline_fallback_with_shared_state_on_redis(redis_url: str) -> None:
    app = slow_upstream()
    with serve(app) as server:
        state = f'state: {{backend: redis, redis: {{url: "{redis_url}", key_prefix: "slo:"}}}}'
        with running_gateway(config_text(server.url, state), ENV) as gw:
            check_deadline_fallback(gw, app)
            counts = admin_get(gw, "/admin/goodput")["models"]["deadline"]
            assert (counts["requests"], counts["with_objective"]) == (1, 1)
