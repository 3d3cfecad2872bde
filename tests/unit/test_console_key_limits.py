"""The console's keys table shows each key's limits read-only: its own (only the fields
set; ``unlimited`` when none is), or ``tenant's`` when its tenant's ``key_limits`` apply."""

from __future__ import annotations

import re

from core.config_tenants import Limits
from gateway.console.data import TenantView
from gateway.console.render import ENVIRONMENT
from gateway.console.session import Session
from gateway.console.viewer import Viewer
from policies.control.records import new_key, public_view


def rendered_limits(*limits: Limits | None) -> list[str]:
    keys = []
    for i, own in enumerate(limits):
        _, record = new_key("acme", f"k{i}", 1.0, limits=own)
        keys.append(public_view(record, 2.0))
    view = TenantView(
        name="acme", source="config", limits={"rpm": None}, key_limits={"rpm": 100}, models=None,
        deny_models=[], use=[], keys=keys,
    )  # fmt: skip
    session = Session(role="admin", tenant=None, key_id=None, credential_sha256="0" * 64,
                      csrf="tok", created=0.0, expires=1.0)  # fmt: skip
    text = ENVIRONMENT.get_template("tenant.html").render(
        title="acme", viewer=Viewer(session_id="s", session=session), page="tenants", t=view,
        control=True, limit_fields=("rpm",), aliases=["chat"],
    )  # fmt: skip
    return re.findall(r'<td class="key-limits">([^<]*)</td>', text)


def test_the_keys_table_shows_each_keys_limits() -> None:
    shown = rendered_limits(None, Limits(rpm=2, usd_per_day=1.5), Limits())
    assert shown == ["tenant's", "rpm=2, usd_per_day=1.5", "unlimited"]
