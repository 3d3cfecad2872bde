"""JWT keys fetched from a real local identity provider (tests/fixtures/jwks_server.py) over
HTTP: rotation without a restart, dropped keys, the unknown-kid rate limit counted at the
server, an IdP that is down or hangs (known kids never wait; unknown kids get a bounded wait
and a 401), discovery errors at start, and the keys a reload carries over.

The authenticator runs as the gateway runs it: ``await prepare(headers)`` then the
synchronous ``authenticate(headers)``. Token times and the refetch cooldown run on a
``FakeClock``; waits are bounded by ``asyncio.timeout`` on the test, never measured."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from cryptography.hazmat.primitives import serialization
from structlog.testing import capture_logs

from core.clock import FakeClock
from core.config import Config, ConfigError
from core.config_tenants import AuthConfig, JwtConfig, TenantConfig
from core.errors import AuthenticationError
from core.tenancy import Principal
from policies.auth import Authenticator
from policies.auth.authenticator import INVALID_TOKEN
from tests.fixtures.jwks_server import DISCOVERY, JWKS, LocalIdP, SigningKey, running_idp

pytestmark = pytest.mark.anyio
TENANTS = {"acme": TenantConfig(), "beta": TenantConfig()}
AUDIENCE = "switchyard"
COOLDOWN_S = 30.0


@pytest.fixture(scope="module")
def key_a() -> SigningKey:
    return SigningKey.rsa("key-a")


@pytest.fixture(scope="module")
def key_b() -> SigningKey:
    return SigningKey.rsa("key-b")


@pytest.fixture(scope="module")
def key_ec() -> SigningKey:
    return SigningKey.ec("key-ec")


@pytest.fixture(scope="module")
def stranger() -> SigningKey:
    return SigningKey.rsa("not-published")


@pytest.fixture(scope="module")
def shared_idp():
    with running_idp() as server:
        yield server


@pytest.fixture
def idp(shared_idp, key_a):
    """The module's IdP, healthy, publishing key A, with no requests counted."""
    shared_idp.reset(key_a)
    yield shared_idp
    shared_idp.reset()  # releases requests a test left hanging


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def jwt_config(idp: LocalIdP, *, discovery: bool = False, **fields) -> JwtConfig:
    source = {"discovery": True} if discovery else {"jwks_url": idp.jwks_url}
    base = {
        "algorithms": ["RS256", "ES256"],
        "issuer": idp.issuer,
        "audience": AUDIENCE,
        "jwks_cooldown_s": COOLDOWN_S,
        **source,
    }
    return JwtConfig(**{**base, **fields})


def authenticator(config: JwtConfig, clock: FakeClock, **kw) -> Authenticator:
    return Authenticator(Config(tenants=TENANTS, auth=AuthConfig(jwt=config)), {}, clock, **kw)


@asynccontextmanager
async def started(config: JwtConfig, clock: FakeClock, **kw) -> AsyncIterator[Authenticator]:
    """An authenticator for ``config``, started, a cooldown later: the start's fetch no
    longer holds back the fetch an unknown kid may cause (a gateway that ran a while)."""
    auth = authenticator(config, clock, **kw)
    await auth.start()
    clock.advance(COOLDOWN_S)
    try:
        yield auth
    finally:
        await auth.aclose()


def claims(idp: LocalIdP, clock: FakeClock, **extra) -> dict:
    base = {
        "iss": idp.issuer,
        "aud": AUDIENCE,
        "tenant": "acme",
        "sub": "svc-1",
        "exp": clock.wall() + 300,
    }
    return {k: v for k, v in {**base, **extra}.items() if v is not None}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def login(auth: Authenticator, token: str) -> Principal:
    """What the gateway does per request: prepare (may fetch), then authenticate."""
    await auth.prepare(bearer(token))
    return auth.authenticate(bearer(token))


async def refused(auth: Authenticator, token: str, reason: str) -> None:
    with pytest.raises(AuthenticationError) as info:
        await login(auth, token)
    assert (info.value.status, info.value.message) == (401, INVALID_TOKEN)
    assert reason in info.value.__cause__.reason


# -- fetching and rotation ------------------------------------------------------------------


@pytest.mark.parametrize("discovery", [False, True], ids=["jwks_url", "discovery"])
async def test_a_token_signed_with_a_published_key_verifies(idp, clock, key_a, key_ec, discovery):
    idp.keys = [key_a, key_ec]
    async with started(jwt_config(idp, discovery=discovery), clock) as auth:
        rs = key_a.sign(claims(idp, clock))
        es = key_ec.sign(claims(idp, clock, tenant="beta", sub="e"))
        assert await login(auth, rs) == Principal(tenant="acme", key_id="jwt:svc-1", via="jwt")
        assert (await login(auth, es)).tenant == "beta"
    assert idp.hits[JWKS] == 1
    assert idp.hits[DISCOVERY] == (1 if discovery else 0)


async def test_rotation_a_new_kid_verifies_after_one_on_demand_refresh(idp, clock, key_a, key_b):
    async with started(jwt_config(idp), clock) as auth:
        assert (await login(auth, key_a.sign(claims(idp, clock)))).tenant == "acme"
        idp.keys = [key_a, key_b]  # the IdP publishes B and starts signing with it
        assert (await login(auth, key_b.sign(claims(idp, clock)))).tenant == "acme"
        assert idp.hits[JWKS] == 2  # the start, and one fetch for B's unknown kid
        assert (await login(auth, key_a.sign(claims(idp, clock, sub="x")))).key_id == "jwt:x"


async def test_a_dropped_key_stops_verifying_after_the_next_background_refresh(idp, key_a, key_b):
    clock = FakeClock()
    idp.keys = [key_a, key_b]
    idp.cache_control = "max-age=0"  # refreshed every cooldown (the floor)
    config = jwt_config(idp, jwks_cooldown_s=0.05)
    async with started(config, clock) as auth:
        old = key_a.sign(claims(idp, clock))
        assert (await login(auth, old)).tenant == "acme"  # verified, and cached
        idp.keys = [key_b]
        async with asyncio.timeout(10):
            while True:  # the background refresher picks the new set up by itself
                try:
                    auth.authenticate(bearer(old))
                except AuthenticationError as exc:
                    assert "no key with kid 'key-a'" in exc.__cause__.reason
                    break
                await asyncio.sleep(0.01)
        assert (await login(auth, key_b.sign(claims(idp, clock)))).tenant == "acme"


async def test_an_unknown_kid_flood_costs_one_fetch_per_cooldown(idp, clock, stranger):
    async with started(jwt_config(idp), clock) as auth:
        assert idp.hits[JWKS] == 1

        def forged() -> str:
            return stranger.sign(claims(idp, clock), kid=uuid.uuid4().hex)

        flood = [forged() for _ in range(50)]
        with capture_logs() as logs:
            outcomes = await asyncio.gather(
                *(login(auth, t) for t in flood), return_exceptions=True
            )
        assert all(isinstance(o, AuthenticationError) for o in outcomes)
        assert idp.hits[JWKS] == 2  # fifty concurrent unknown kids shared one fetch
        assert [e["event"] for e in logs].count("jwt.unknown_kid") == 1  # one line per fetch
        for _ in range(50):
            await refused(auth, forged(), "no key with kid")
        assert idp.hits[JWKS] == 2  # within the cooldown: no fetch at all
        clock.advance(COOLDOWN_S)
        for _ in range(20):
            await refused(auth, forged(), "no key with kid")
        assert idp.hits[JWKS] == 3  # one more per cooldown


async def test_tokens_of_another_issuer_or_alg_never_trigger_a_fetch(idp, clock, stranger):
    async with started(jwt_config(idp), clock) as auth:
        other_issuer = stranger.sign(claims(idp, clock, iss="https://evil.example"))
        await refused(auth, other_issuer, "no key with kid")
        hs = forge_hs256(claims(idp, clock), b"k" * 32, kid="fresh")
        await refused(auth, hs, "not allowed")
        assert idp.hits[JWKS] == 1


# -- the IdP down or hanging ----------------------------------------------------------------


async def test_known_kids_verify_while_the_idp_hangs(idp, clock, key_a, stranger):
    # a 60 s fetch timeout: any wait on the IdP would outlast the test's 5 s limit
    async with started(jwt_config(idp, jwks_timeout_s=60), clock) as auth:
        idp.jwks_mode = "hang"
        waiting = asyncio.create_task(login(auth, stranger.sign(claims(idp, clock))))
        await idp.until_hanging()  # a refresh is in flight, held by the IdP
        async with asyncio.timeout(5):
            for n in range(20):
                token = key_a.sign(claims(idp, clock, sub=f"s{n}"))
                assert (await login(auth, token)).key_id == f"jwt:s{n}"
        assert not waiting.done()  # the unknown kid is still waiting; the known ones did not
        idp.jwks_mode = "ok"
        with pytest.raises(AuthenticationError):
            await waiting


async def test_an_unknown_kid_while_the_idp_hangs_is_refused_after_a_bounded_wait(
    idp, clock, key_a, stranger
):
    async with started(jwt_config(idp, jwks_timeout_s=0.3), clock) as auth:
        idp.jwks_mode = "hang"
        with capture_logs() as logs:
            async with asyncio.timeout(5):
                await refused(auth, stranger.sign(claims(idp, clock)), "no key with kid")
        events = [entry["event"] for entry in logs]
        assert "jwt.unknown_kid" in events
        unknown = next(entry for entry in logs if entry["event"] == "jwt.unknown_kid")
        assert (unknown["kid"], unknown["known"]) == ("not-published", 1)
        assert (await login(auth, key_a.sign(claims(idp, clock)))).tenant == "acme"


@pytest.mark.parametrize("mode", ["fail", "junk"])
async def test_an_idp_that_fails_keeps_the_known_keys(idp, clock, key_a, key_b, mode):
    async with started(jwt_config(idp), clock) as auth:
        idp.jwks_mode = mode
        idp.keys = [key_a, key_b]
        with capture_logs() as logs:
            await refused(auth, key_b.sign(claims(idp, clock)), "no key with kid")
        failed = [entry for entry in logs if entry["event"] == "jwks.refresh_failed"]
        assert failed and failed[0]["keeping"] == 1
        assert (await login(auth, key_a.sign(claims(idp, clock)))).tenant == "acme"
        idp.jwks_mode = "ok"  # the IdP is back: the next cooldown's fetch brings B
        await refused(auth, key_b.sign(claims(idp, clock, sub="again")), "no key with kid")
        clock.advance(COOLDOWN_S)
        assert (await login(auth, key_b.sign(claims(idp, clock)))).tenant == "acme"


async def test_after_a_failed_fetch_discovery_is_asked_again(idp, clock, key_a, key_b):
    async with started(jwt_config(idp, discovery=True), clock) as auth:
        assert (idp.hits[DISCOVERY], idp.hits[JWKS]) == (1, 1)
        idp.jwks_mode = "fail"
        await refused(auth, key_b.sign(claims(idp, clock)), "no key with kid")
        idp.jwks_mode = "ok"
        idp.keys = [key_a, key_b]
        clock.advance(COOLDOWN_S)
        assert (await login(auth, key_b.sign(claims(idp, clock)))).tenant == "acme"
        assert (idp.hits[DISCOVERY], idp.hits[JWKS]) == (2, 3)


async def test_an_idp_down_at_start_is_retried_on_demand(idp, clock, key_a):
    idp.jwks_mode = "fail"
    async with started(jwt_config(idp), clock) as auth:  # no error: transient
        await refused(auth, key_a.sign(claims(idp, clock)), "no key with kid")
        idp.jwks_mode = "ok"
        clock.advance(COOLDOWN_S)
        assert (await login(auth, key_a.sign(claims(idp, clock)))).tenant == "acme"


# -- what the token must carry --------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge_hs256(payload: dict, secret: bytes, **header) -> str:
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", **header}).encode())
    body = b64(json.dumps(payload).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


async def test_wrong_issuer_audience_expiry_and_alg_none_are_refused(idp, clock, key_a):
    async with started(jwt_config(idp), clock) as auth:
        await refused(auth, key_a.sign(claims(idp, clock, iss="https://evil.example")), "Issuer")
        await refused(auth, key_a.sign(claims(idp, clock, iss=None)), "iss")
        await refused(auth, key_a.sign(claims(idp, clock, aud="other-app")), "Audience")
        await refused(auth, key_a.sign(claims(idp, clock, exp=clock.wall() - 60)), "expired")
        head = b64(json.dumps({"alg": "none", "kid": "key-a"}).encode())
        await refused(auth, f"{head}.{b64(json.dumps(claims(idp, clock)).encode())}.", "none")


async def test_hs256_signed_with_a_published_public_key_is_refused(idp, clock, key_a):
    """Key confusion: HMAC "signed" with the JWK, or its PEM, as the secret."""
    async with started(jwt_config(idp), clock) as auth:
        pem = key_a.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for secret in (pem, json.dumps(key_a.jwk()).encode()):
            await refused(auth, forge_hs256(claims(idp, clock), secret, kid="key-a"), "not allowed")


async def test_symmetric_and_encryption_keys_in_the_jwks_are_never_used(idp, clock, key_a):
    secret_jwk = {"kty": "oct", "kid": "shared", "k": b64(b"k" * 32), "alg": "HS256"}
    encryption = {**key_a.jwk(), "kid": "enc", "use": "enc"}
    idp.extra_jwks = [secret_jwk, encryption]
    async with started(jwt_config(idp), clock) as auth:
        await refused(auth, forge_hs256(claims(idp, clock), b"k" * 32, kid="shared"), "not allowed")
        await refused(auth, key_a.sign(claims(idp, clock), kid="shared"), "no key with kid")
        await refused(auth, key_a.sign(claims(idp, clock), kid="enc"), "no key with kid")
        assert (await login(auth, key_a.sign(claims(idp, clock)))).tenant == "acme"


# -- discovery and config errors ------------------------------------------------------------


def no_jwks_uri(idp: LocalIdP) -> None:
    idp.discovery = {"issuer": idp.issuer}


def other_issuer(idp: LocalIdP) -> None:
    idp.discovery = {"issuer": "https://other.example", "jwks_uri": idp.jwks_url}


def junk_discovery(idp: LocalIdP) -> None:
    idp.discovery_mode = "junk"


def junk_jwks(idp: LocalIdP) -> None:
    idp.jwks_mode = "junk"


def no_keys(idp: LocalIdP) -> None:
    idp.keys = []
    idp.extra_jwks = [{"kty": "oct", "kid": "k", "k": "c2VjcmV0"}]


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (no_jwks_uri, "has no http(s) jwks_uri"),
        (other_issuer, "names issuer 'https://other.example'"),
        (junk_discovery, "did not send JSON"),
        (junk_jwks, "did not send JSON"),
        (no_keys, "no usable signing key (kid 'k'"),
    ],
)
async def test_an_unusable_idp_answer_is_a_config_error_at_start(idp, clock, breakage, message):
    breakage(idp)
    auth = authenticator(jwt_config(idp, discovery=True), clock)
    with pytest.raises(ConfigError) as info:
        await auth.start()
    assert len(info.value.errors) == 1
    assert info.value.errors[0].startswith("auth.jwt: ")
    assert message in info.value.errors[0], info.value.errors


async def test_a_wrong_jwks_url_is_a_config_error_at_start(idp, clock):
    auth = authenticator(JwtConfig(jwks_url=idp.url + "/nowhere", audience=AUDIENCE), clock)
    with pytest.raises(ConfigError, match="answered HTTP 404"):
        await auth.start()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"jwks_url": "https://idp.example/jwks", "discovery": True}, "not both"),
        ({"discovery": True}, "discovery needs issuer"),
        ({"jwks_url": "https://i/j", "jwks_file": "k.json"}, "two sources of public keys"),
        ({"discovery": True, "issuer": "https://i", "public_key_file": "k.pem"}, "two sources"),
        ({"jwks_url": "https://i/j", "algorithms": ["RS256", "HS256"]}, "HS256 cannot be"),
        ({"jwks_url": "file:///etc/jwks.json"}, "must be an http(s) URL"),
        ({"discovery": True, "issuer": "idp.example"}, "issuer must be an http(s) URL"),
    ],
)
def test_contradictory_jwt_settings_are_refused_with_their_key_path(fields, message):
    from core.config import parse_config

    text = "auth:\n  jwt: " + json.dumps(fields) + "\ntenants: {acme: {}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(e.startswith("auth.jwt: ") and message in e for e in info.value.errors), (
        info.value.errors
    )


# -- lifetime: reloads and closing ----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fetches"),
    [
        ({}, 0),  # the same JWT settings: the fresh keys are handed over, nothing is fetched
        ({"audience": "renamed"}, 0),  # other JWT settings do not matter to the keys
        ({"jwks_refresh_s": 600}, 1),  # another timing: a fetch, which fails; keys kept
    ],
)
@pytest.mark.parametrize("outage", ["fail", "junk"])
async def test_a_reload_keeps_the_known_keys_while_the_idp_is_down(
    idp, clock, key_a, change, fetches, outage
):
    old = authenticator(jwt_config(idp), clock)
    await old.start()
    assert (await login(old, key_a.sign(claims(idp, clock)))).tenant == "acme"
    idp.jwks_mode = outage  # junk would be a config error for a source without keys
    new = authenticator(jwt_config(idp, **change), clock, previous=old)
    await new.start()
    await old.aclose()
    try:
        token = key_a.sign(claims(idp, clock, sub="n", aud=change.get("audience", AUDIENCE)))
        assert (await login(new, token)).key_id == "jwt:n"
        assert idp.hits[JWKS] == 1 + fetches
    finally:
        await new.aclose()


async def test_a_reload_to_another_idp_starts_from_its_keys(idp, clock, key_a, key_b):
    old = authenticator(jwt_config(idp), clock)
    await old.start()
    with running_idp(key_b) as other:
        async with started(jwt_config(other), clock, previous=old) as new:
            await old.aclose()
            assert (await login(new, key_b.sign(claims(other, clock)))).tenant == "acme"
            await refused(new, key_a.sign(claims(other, clock)), "no key with kid 'key-a'")
        assert other.hits[JWKS] == 2  # its start, and the unknown kid 'key-a'


async def test_a_closed_source_never_fetches_again(idp, clock, stranger):
    auth = authenticator(jwt_config(idp), clock)
    await auth.start()
    await auth.aclose()
    clock.advance(COOLDOWN_S)
    await refused(auth, stranger.sign(claims(idp, clock)), "no key with kid")
    assert idp.hits[JWKS] == 1
