"""The Authenticator's API-key matrix, admin key, open mode, header parsing and the model
allow/deny checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config import Config, ConfigError
from core.config_tenants import AuthConfig, TenantConfig
from core.errors import AuthenticationError, PermissionDeniedError
from core.tenancy import ADMIN, OPEN, Principal
from policies.auth import Authenticator, KeysFile, bearer_token
from policies.auth.authenticator import INCORRECT_KEY, MISSING_CREDENTIAL

ADMIN_KEY = "admin-" + "k" * 40
TENANTS = {
    "acme": TenantConfig(models=["small", "large"], deny_models=["large"]),
    "beta": TenantConfig(deny_models=["secret"]),
}


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def keys(tmp_path):
    return KeysFile(tmp_path / "keys.json")


def make(keys, clock, *, tenants=TENANTS, admin=True) -> Authenticator:
    auth = AuthConfig(admin_key_env="ADMIN_KEY", keys_file=str(keys.path))
    env = {"ADMIN_KEY": ADMIN_KEY} if admin else {}
    return Authenticator(Config(tenants=tenants, auth=auth), env, clock)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def refused(auth: Authenticator, headers, message: str) -> None:
    with pytest.raises(AuthenticationError) as info:
        auth.authenticate(headers)
    assert info.value.status == 401
    assert info.value.code == "invalid_api_key"
    assert info.value.message == message


def test_valid_key_authenticates_as_its_tenant(keys, clock):
    plaintext, record = keys.create("acme", "ci")
    auth = make(keys, clock)
    principal = auth.authenticate(bearer(plaintext))
    assert principal == Principal(tenant="acme", key_id=record.key_id, via="api_key")
    assert auth.tenant_config(principal) is TENANTS["acme"]


def test_another_tenants_key_authenticates_as_that_tenant(keys, clock):
    acme, _ = keys.create("acme", "a")
    beta, beta_record = keys.create("beta", "b")
    auth = make(keys, clock)
    assert auth.authenticate(bearer(acme)).tenant == "acme"
    principal = auth.authenticate(bearer(beta))
    assert (principal.tenant, principal.key_id) == ("beta", beta_record.key_id)


def test_revoked_after_load_takes_effect_after_the_recheck(keys, clock):
    plaintext, record = keys.create("acme", "ci")
    auth = make(keys, clock)
    assert auth.authenticate(bearer(plaintext)).tenant == "acme"
    keys.revoke(record.key_id)
    clock.advance(0.9)
    assert auth.authenticate(bearer(plaintext)).tenant == "acme"
    clock.advance(0.1)
    refused(auth, bearer(plaintext), INCORRECT_KEY)


def test_unknown_wrong_secret_and_revoked_keys_read_the_same(keys, clock):
    plaintext, record = keys.create("acme", "ci")
    gone, gone_record = keys.create("acme", "old")
    keys.revoke(gone_record.key_id)
    auth = make(keys, clock)
    refused(auth, bearer("sy-ffffffffffff-" + "A" * 43), INCORRECT_KEY)
    refused(auth, bearer(f"sy-{record.key_id}-" + "A" * 43), INCORRECT_KEY)
    refused(auth, bearer(gone), INCORRECT_KEY)
    refused(auth, bearer("sk-proj-something"), INCORRECT_KEY)
    refused(auth, bearer(plaintext + "x"), INCORRECT_KEY)


def test_a_key_whose_tenant_left_the_config_is_refused(keys, clock):
    plaintext, _ = keys.create("gone", "ci")
    refused(make(keys, clock), bearer(plaintext), INCORRECT_KEY)


def test_no_keys_file_means_no_key_is_valid(keys, clock):
    plaintext, _ = keys.create("acme", "ci")
    auth = Authenticator(Config(tenants=TENANTS), {}, clock)
    refused(auth, bearer(plaintext), INCORRECT_KEY)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": ""},
        {"authorization": "Bearer"},
        {"authorization": "Bearer   "},
        {"authorization": "Basic dXNlcjpwYXNz"},
        {"x-api-key": "  "},
    ],
)
def test_missing_or_malformed_header(keys, clock, headers):
    refused(make(keys, clock), headers, MISSING_CREDENTIAL)


def test_header_spellings(keys, clock):
    plaintext, _ = keys.create("acme", "ci")
    auth = make(keys, clock)
    for headers in (
        {"Authorization": f"Bearer {plaintext}"},
        {"authorization": f"bearer {plaintext}"},
        {"authorization": f"BEARER  {plaintext} "},
        {"x-api-key": plaintext},
        {"X-Api-Key": plaintext},
        {"authorization": "Basic abc", "x-api-key": plaintext},
    ):
        assert auth.authenticate(headers).tenant == "acme", headers
    assert bearer_token({"authorization": "Bearer a", "x-api-key": "b"}) == "a"


def test_admin_key(keys, clock):
    auth = make(keys, clock)
    assert auth.authenticate(bearer(ADMIN_KEY)) is ADMIN
    assert auth.authenticate({"x-api-key": ADMIN_KEY}) is ADMIN
    refused(auth, bearer(ADMIN_KEY[:-1]), INCORRECT_KEY)
    refused(auth, bearer(ADMIN_KEY + "k"), INCORRECT_KEY)
    auth.require_admin(ADMIN)
    assert auth.tenant_config(ADMIN) is None


def test_without_the_admin_env_var_there_is_no_admin(keys, clock):
    auth = make(keys, clock, admin=False)
    refused(auth, bearer(ADMIN_KEY), INCORRECT_KEY)


def test_require_admin_refuses_tenants_and_open_callers(keys, clock):
    plaintext, _ = keys.create("acme", "ci")
    auth = make(keys, clock)
    for principal in (auth.authenticate(bearer(plaintext)), OPEN):
        with pytest.raises(PermissionDeniedError) as info:
            auth.require_admin(principal)
        assert info.value.status == 403


def test_open_gateway_accepts_anything_but_still_knows_the_admin(keys, clock):
    auth = make(keys, clock, tenants={})
    assert auth.authenticate({}) is OPEN
    assert auth.authenticate(bearer("whatever")) is OPEN
    assert auth.authenticate(bearer("a.b.c")) is OPEN
    assert auth.authenticate(bearer(ADMIN_KEY)) is ADMIN
    auth.authorize_model(OPEN, "anything")
    assert auth.tenant_config(OPEN) is None


def test_open_gateway_ignores_a_broken_keys_file(tmp_path, clock):
    path = tmp_path / "keys.json"
    path.write_text("{broken")
    config = Config(auth=AuthConfig(keys_file=str(path)))
    assert Authenticator(config, {}, clock).authenticate({}) is OPEN


def test_a_broken_keys_file_is_a_config_error(tmp_path, clock):
    path = tmp_path / "keys.json"
    path.write_text("{broken")
    config = Config(tenants=TENANTS, auth=AuthConfig(keys_file=str(path)))
    with pytest.raises(ConfigError) as info:
        Authenticator(config, {}, clock)
    assert info.value.errors[0].startswith("auth.keys_file:")


def test_relative_keys_file_starts_at_the_config_folder(tmp_path, clock):
    plaintext, _ = KeysFile(tmp_path / "state" / "keys.json").create("beta", "ci")
    config = Config(
        tenants=TENANTS,
        auth=AuthConfig(keys_file="state/keys.json"),
        source=str(tmp_path / "config.yaml"),
    )
    assert Authenticator(config, {}, clock).authenticate(bearer(plaintext)).tenant == "beta"


@pytest.mark.parametrize(
    ("tenant", "alias", "allowed"),
    [
        ("acme", "small", True),
        ("acme", "large", False),  # on the allow-list but denied: deny wins
        ("acme", "other", False),  # not on the allow-list
        ("beta", "small", True),  # no allow-list: everything but the deny-list
        ("beta", "secret", False),
        ("ghost", "small", False),  # a tenant no longer in the config
    ],
)
def test_model_allow_and_deny(keys, clock, tenant, alias, allowed):
    auth = make(keys, clock)
    principal = Principal(tenant=tenant, key_id="k", via="api_key")
    if allowed:
        auth.authorize_model(principal, alias)
        return
    with pytest.raises(PermissionDeniedError) as info:
        auth.authorize_model(principal, alias)
    assert (info.value.status, info.value.param) == (403, "model")
    assert alias in info.value.message


def test_admin_may_use_every_model(keys, clock):
    make(keys, clock).authorize_model(ADMIN, "secret")


@pytest.fixture(scope="module")
def fuzz_auth(tmp_path_factory):
    keys = KeysFile(tmp_path_factory.mktemp("fuzz") / "keys.json")
    keys.create("acme", "ci")
    return make(keys, FakeClock())


@given(
    value=st.text(max_size=80),
    name=st.sampled_from(["authorization", "Authorization", "x-api-key"]),
    prefix=st.sampled_from(["", "Bearer ", "bearer sy-", "Bearer eyJ", "Bearer a.b."]),
)
def test_arbitrary_headers_never_crash_or_authenticate(fuzz_auth, value, name, prefix):
    try:
        principal = fuzz_auth.authenticate({name: prefix + value})
    except AuthenticationError as exc:
        assert exc.status == 401
    else:
        raise AssertionError(f"authenticated a made-up credential as {principal}")
