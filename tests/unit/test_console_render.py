"""The console's HTML (gateway/console/render.py and templates/): every value is escaped,
so hostile tenant, key and model names render as text; no template carries an inline
script, style or event handler (the Content-Security-Policy would block it anyway); every
answer carries the security headers; the policy view masks headers and DSNs."""

from __future__ import annotations

import re

import msgspec
import pytest

from core.config import parse_config
from core.errors import GatewayError
from gateway.console.data import MASK, TenantView, policy_yaml
from gateway.console.render import CSP, ENVIRONMENT, TEMPLATES, html, number, usd, when
from gateway.console.session import Session
from gateway.console.viewer import Viewer
from gateway.request.explain import Explanation
from gateway.telemetry.recent import RecentRequest

XSS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "';alert(1);//",
    "<svg/onload=alert(1)>",
    "{{ 7*7 }}",
]


def viewer(admin: bool = True) -> Viewer:
    session = Session(
        role="admin" if admin else "tenant_admin", tenant=None if admin else "acme",
        key_id=None if admin else "k1", credential_sha256="0" * 64, csrf="tok", created=0.0,
        expires=1.0,
    )  # fmt: skip
    return Viewer(session_id="s", session=session)


def request_item(name: str) -> RecentRequest:
    return RecentRequest(
        seq=1, ts=1_700_000_000.0, request_id="req_1", tenant=name, key_id=name, model=name,
        provider=name, upstream_model=name, endpoint="chat", stream=False, status=404,
        error=name, attempts=0, fallbacks=0, latency_ms=1.0, ttft_ms=None, prompt_tokens=None,
        completion_tokens=None, cost_usd=0.0, cache_hit=False, route_reason=name,
    )  # fmt: skip


def tenant_view(name: str) -> TenantView:
    key = {
        "id": "abc123", "object": "api_key", "tenant": name, "name": name, "status": "active",
        "created": 0.0, "updated": 0.0, "expires_at": None, "revoked_at": None,
        "previous_valid_until": None, "allowed_models": [name], "metadata": {name: name},
    }  # fmt: skip
    return TenantView(
        name=name, source="config", limits={"rpm": 5}, key_limits={}, models=[name],
        deny_models=[name], use=[{"scope": "tenant", "metric": "requests", "limit": 5, "used": 1}],
        keys=[key],
    )  # fmt: skip


def assert_inert(text: str, name: str) -> None:
    """The hostile ``name`` is nowhere in the HTML as markup."""
    if any(c in name for c in "<>\"'&"):
        assert name not in text
    assert "<script>alert" not in text and "<img src=x" not in text and "<svg/onload" not in text


@pytest.mark.parametrize("name", XSS)
def test_hostile_names_render_as_text_in_every_table(name: str) -> None:
    pages = {
        "requests_table.html": {"items": [request_item(name)], "filtered": True},
        "tenant.html": {
            "title": name, "viewer": viewer(), "page": "tenants", "t": tenant_view(name),
            "control": True, "limit_fields": ("rpm",), "aliases": [name],
        },
        "tenants.html": {"title": "t", "viewer": viewer(), "page": "tenants",
                         "tenants": [tenant_view(name)], "control": True},
        "explain.html": {
            "explained": Explanation(model=name, strategy="Priority", ordered=[(name, name)],
                                     skipped=[(name, name)]),
            "explain_error": None,
        },
        "key_secret.html": {"title": "k", "viewer": viewer(False), "page": "tenants",
                            "heading": name, "secret": name, "key": tenant_view(name).keys[0]},
    }  # fmt: skip
    for template, context in pages.items():
        text = ENVIRONMENT.get_template(template).render(**context)
        assert_inert(text, name)
        if name == "{{ 7*7 }}":
            assert "49" not in text  # data is never evaluated as a template


def test_chart_data_in_an_attribute_cannot_close_it() -> None:
    template = ENVIRONMENT.from_string("<canvas data-usage='{{ chart|tojson }}'></canvas>")
    text = template.render(chart={"labels": ["x' onmouseover='alert(1)", "</canvas><script>"]})
    assert "'alert(1)" not in text and "<script>" not in text
    assert text.count("'") == 2


def test_no_template_has_inline_script_style_or_handlers() -> None:
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), path.name
        assert "<style" not in text and " style=" not in text, path.name
        assert not re.search(r"\son[a-z]+\s*=", text), path.name
        assert "javascript:" not in text and "|safe" not in text, path.name


def test_every_answer_carries_the_security_headers() -> None:
    response = html("error.html", status=404, error=_error(), viewer=None, page="", title="x")
    headers = response.headers
    assert headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    assert "unsafe" not in CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["cache-control"] == "no-store"


def _error() -> GatewayError:
    error = GatewayError("<b>nope</b>")
    error.status = 404
    return error


def test_error_messages_are_escaped_too() -> None:
    response = html("error.html", status=404, error=_error(), viewer=None, page="", title="x")
    assert "&lt;b&gt;nope&lt;/b&gt;" in str(response.content)


def test_the_policy_view_masks_provider_headers_and_dsns() -> None:
    config = parse_config(
        """
providers:
  oa: {type: openai, base_url: "http://x/v1", headers: {authorization: "Bearer sk-live-1"}}
ledger: {backend: postgres, dsn: "postgresql://u:hunter2@db/x"}
models:
  m: {targets: [{provider: oa, model: m}]}
"""
    )
    text = policy_yaml(config)
    assert "sk-live-1" not in text and "hunter2" not in text
    data = msgspec.yaml.decode(text.encode())
    assert data["providers"]["oa"]["headers"] == {"authorization": MASK}
    assert data["ledger"]["dsn"] == MASK
    assert data["models"]["m"]["targets"][0]["provider"] == "oa"


def test_filters_format_for_tables() -> None:
    assert when(0.0) == "1970-01-01 00:00:00Z" and when(None) == ""
    assert number(1234.5678) == "1,234.57" and number(None) == ""
    assert usd(0.0) == "$0" and usd(1.5) == "$1.5" and usd(0.000123) == "$0.000123"
    assert usd(100.0) == "$100"
