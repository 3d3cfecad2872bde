"""Hedged first tokens over real HTTP (issue 18): a gateway with ``slo`` and ``hedge_share``
in front of a fake OpenAI upstream whose cheap model turns late. The request with an
objective starts the dear target alongside once the cheap one is past its p99 prediction,
is served by whichever answers first, and the loser is let go: its upstream sees the
client leave, its breaker stays closed, its lateness counts as a cut. The log line says
``hedged`` and what the loser's prompt likely cost; the tenant pays for the winner only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import structlog

from core.config import LoggingConfig
from gateway.process.observe import configure_logging
from tests.fixtures.fake_slow_openai import SlowOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway
from tests.integration.test_routing_promise import (
    ADMIN,
    SLO,
    stream_once,
    streamed_text,
    target,
    wait_until,
)

CHEAP, DEAR = "patient/m-late-h", "patient/m-dear-h"


def config_text(up: str) -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN}}
routing: {{max_attempts_per_target: 1}}
providers:
  patient: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA, first_token_timeout_s: 20}}
models:
  hedged:
    strategy: {{type: slo, hedge_share: 0.5}}
    targets:
      - {{provider: patient, model: m-late-h, price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
      - {{provider: patient, model: m-dear-h, price: {{input_per_mtok: 5, output_per_mtok: 15}}}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[SlowOpenAI]:
    app = SlowOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture(scope="module")
def gateway(upstream: SlowOpenAI) -> Iterator[Gateway]:
    env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
    with running_gateway(config_text(upstream.url), env) as gw:  # type: ignore[attr-defined]
        yield gw


def completed_lines(out: str) -> dict[str, dict[str, object]]:
    lines = {}
    for line in out.splitlines():
        if '"request.completed"' in line:
            entry = json.loads(line)
            lines[str(entry["request_id"])] = entry
    return lines


def test_a_late_cheap_target_is_hedged_and_the_dear_one_serves(
    gateway: Gateway, upstream: SlowOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream.delays["m-late-h"] = 0.2
    for _ in range(3):  # the cheap target, measured at ~0.2 s, serves while on time
        warm = stream_once(gateway, "hedged", {SLO: "3000"})
        assert warm.status == 200 and warm.served == "m-late-h", warm.reason
        assert "hedged" not in warm.reason
    upstream.delays["m-late-h"] = 6.0  # now late: well past its p99, inside its timeout
    configure_logging(LoggingConfig(level="info", json=True), cache=False)
    try:
        answer = stream_once(gateway, "hedged", {SLO: "3000"})
    finally:
        structlog.reset_defaults()
    assert answer.status == 200, answer.text
    assert answer.served == "m-dear-h", answer.reason
    assert f"hedged, {CHEAP} lost" in answer.reason, answer.reason
    assert streamed_text(answer.text) == "Hello from openai!"
    assert answer.elapsed_s < 2.5, answer.elapsed_s  # not the 6 s of the late target
    assert wait_until(lambda: upstream.abandoned["m-late-h"] == 1), "the loser was not let go"

    line = completed_lines(capsys.readouterr().out)[answer.headers["x-request-id"]]
    assert line["hedged"] is True and line["attempts"] == 2, line
    prompt = int(line["prompt_tokens"])  # type: ignore[call-overload]
    completion = int(line["completion_tokens"])  # type: ignore[call-overload]
    # The tenant pays the winner's tokens; the loser's prompt is the operator's estimate.
    assert line["cost_usd"] == pytest.approx((prompt * 5 + completion * 15) / 1e6)
    assert line["hedge_cost_usd"] == pytest.approx(prompt * 1 / 1e6)

    late = target(gateway, CHEAP)
    assert late["breaker"] == "closed" and late["in_flight"] == 0, late
    assert late["ttft_penalty"] > 1.0, late  # losing the race counts as a cut
    assert target(gateway, DEAR)["in_flight"] == 0


def test_on_time_answers_start_no_hedge(gateway: Gateway, upstream: SlowOpenAI) -> None:
    """The budget and the hedge moment keep hedges for late answers: a request whose
    first target answers in time opens nothing on the second."""
    upstream.delays["m-late-h"] = 0.0
    before = len(upstream.requests)
    answer = stream_once(gateway, "hedged", {SLO: "60000"})
    assert answer.status == 200 and "hedged" not in answer.reason, answer.reason
    assert len(upstream.requests) == before + 1


def test_a_client_that_leaves_mid_race_releases_both_upstreams(
    gateway: Gateway, upstream: SlowOpenAI
) -> None:
    """Both racers still waiting when the client goes: each upstream sees its request
    abandoned, the gateway holds neither target any more."""
    upstream.delays["m-late-h"], upstream.delays["m-dear-h"] = 8.0, 8.0
    before = dict(upstream.abandoned)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway.base_url + "/chat/completions",
            json={
                "model": "hedged",
                "stream": True,
                "messages": [{"role": "user", "content": "x"}],
            },
            headers={SLO: "3000"},
            # past the hedge moment (by the objective, 3 s, whatever the cheap target's
            # measured spread makes its patience), before any answer (8 s)
            timeout=httpx.Timeout(10.0, read=6.0),
        )

    def released() -> bool:
        return all(upstream.abandoned[m] == before.get(m, 0) + 1 for m in ("m-late-h", "m-dear-h"))

    try:
        assert wait_until(released), dict(upstream.abandoned)
        assert wait_until(lambda: target(gateway, CHEAP)["in_flight"] == 0)
        assert target(gateway, DEAR)["in_flight"] == 0
    finally:
        upstream.delays["m-dear-h"] = 0.0
