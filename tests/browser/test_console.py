"""The admin console in a real headless Chromium (Debian's package, driven by Playwright),
against a real gateway over loopback HTTP with a fake OpenAI upstream.

An admin logs in and sees every page with its charts; watches a target's breaker open
live after its upstream fails; creates a key, uses it with the official openai SDK,
revokes it and sees the SDK refused; reads a usage chart, table and CSV download that
match the ledger; runs route explain. A tenant admin sees only its tenant. Hostile tenant,
alias, model and key names render as text; a cross-site form POST is refused. No page
breaks its Content-Security-Policy or throws a script error. Each page's screenshot is
saved (tests/browser/world.py says where)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Dialog, Page, expect

from policies.ledger.sqlite import SqliteLedger
from tests.browser.world import (
    ADMIN,
    XSS_ALIAS,
    XSS_KEY,
    XSS_MODEL,
    XSS_TENANT,
    World,
    artifacts,
)
from tests.fixtures.server import ServerThread

pytestmark = pytest.mark.servers
TIMEOUT_MS = 10_000
EXPECTED_4XX = "Failed to load resource: the server responded with a status of 4"


class Tab:
    """A page in its own browser context (its own cookies), recording what must never
    happen: script errors, CSP violations, alert/prompt dialogs (confirms are accepted)."""

    def __init__(self, browser: Browser, world: World) -> None:
        self.context = browser.new_context(accept_downloads=True)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.world = world
        self.problems: list[str] = []
        self.page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        self.page.on("console", self._console)
        self.page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        # CSP violations are console errors; the 4xx pages some tests open on purpose
        # are logged as "Failed to load resource" and are no problem.
        if message.type == "error" and not message.text.startswith(EXPECTED_4XX):
            self.problems.append(f"console: {message.text}")

    def _dialog(self, dialog: Dialog) -> None:
        if dialog.type == "confirm":
            dialog.accept()
            return
        self.problems.append(f"{dialog.type} dialog: {dialog.message}")
        dialog.dismiss()

    def open(self, path: str) -> Page:
        self.page.goto(self.world.url + path)
        return self.page

    def login(self, credential: str) -> Page:
        page = self.open("/console/login")
        page.fill("#credential", credential)
        page.click("button[type=submit]")
        page.wait_for_url("**/console/overview")
        return page

    def shot(self, name: str) -> None:
        self.page.screenshot(path=artifacts() / f"console-{name}.png", full_page=True)

    def close(self) -> None:
        self.context.close()
        assert self.problems == []


@pytest.fixture
def tab(browser: Browser, world: World) -> Iterator[Tab]:
    tab = Tab(browser, world)
    yield tab
    tab.close()


def chat(world: World, key: str, model: str = "chat", content: str = "hello") -> Any:
    client = openai.OpenAI(base_url=world.base_url, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]


def test_the_admin_logs_in_and_sees_every_page(tab: Tab, world: World) -> None:
    for tenant in ("acme", "globex"):
        chat(world, world.keys[tenant], content="x" * 40)
    page = tab.open("/console")
    expect(page.locator("h1")).to_have_text("Log in")
    tab.shot("login")
    tab.login(ADMIN)
    expect(page.locator("[data-timeline]")).to_have_attribute("data-loaded", "60")
    expect(page.locator("#stat-requests")).not_to_have_text("0")
    tab.shot("overview")
    page.click("header nav a[href='/console/targets']")
    expect(page.locator("h1")).to_have_text("Targets")
    for path, heading in [
        ("targets", "Targets"),
        ("tenants", "Tenants"),
        ("tenants/acme", "Tenant acme"),
        ("usage", "Usage"),
        ("routing", "Routing"),
        ("requests", "Recent requests"),
    ]:
        tab.open(f"/console/{path}")
        expect(page.locator("h1")).to_contain_text(heading)
        if path == "usage":
            expect(page.locator("canvas[data-usage]")).to_have_attribute("data-drawn", "1")
        tab.shot(path.replace("/", "-"))
    cookie = next(c for c in tab.context.cookies() if c["name"] == "sy_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"


def test_a_failing_upstream_opens_its_breaker_on_the_live_targets_page(
    tab: Tab, world: World
) -> None:
    page = tab.login(ADMIN)
    tab.open("/console/targets")
    row = page.locator("tr[data-target='oa/m-flaky']")
    expect(row.locator(".breaker")).to_have_text("closed")
    world.upstream.failing.add("m-flaky")
    try:
        for _ in range(3):
            with pytest.raises(openai.APIStatusError):
                chat(world, ADMIN, model="flaky")
    finally:
        world.upstream.failing.discard("m-flaky")
    expect(row.locator(".breaker")).to_have_text("open")  # htmx polled it in, no reload
    expect(row.locator(".state")).to_have_text("open")
    expect(page.locator("tr[data-target='oa/m-count'] .breaker")).to_have_text("closed")
    tab.shot("targets-breaker-open")


def test_a_key_made_in_the_console_works_with_the_sdk_until_it_is_revoked(
    tab: Tab, world: World
) -> None:
    page = tab.login(ADMIN)
    tab.open("/console/tenants/acme")
    page.fill("#key-name", XSS_KEY)
    page.click("#create-key button[type=submit]")
    expect(page.locator("h1")).to_have_text("Key created")
    secret = page.locator("#secret").inner_text()
    assert secret.startswith("sy-")
    tab.shot("key-created")
    reply = chat(world, secret)
    assert reply.choices[0].message.content == "Hello from openai!"
    key_id = secret.split("-")[1]
    tab.open("/console/tenants/acme")
    row = page.locator(f"tr[data-key='{key_id}']")
    expect(row.locator(".key-name")).to_have_text(XSS_KEY)  # shown as text, not markup
    row.locator("button.danger").click()  # confirms (accepted), then POSTs
    expect(row.locator(".state")).to_have_text("revoked")
    with pytest.raises(openai.AuthenticationError):
        chat(world, secret)


def _ledger_totals(world: World, tenant: str) -> tuple[int, float, dict[str, Any]]:
    async def read() -> list[Any]:
        ledger = SqliteLedger(world.folder / "usage.sqlite3")
        try:
            return [row async for row in ledger.rows(tenant=tenant)]
        finally:
            await ledger.aclose()

    with ThreadPoolExecutor(1) as thread:  # Playwright's loop runs in this thread
        rows = thread.submit(asyncio.run, read()).result()
    return len(rows), math.fsum(r.cost_usd for r in rows), {r.request_id: r for r in rows}


def test_the_usage_chart_table_and_csv_match_the_ledger(tab: Tab, world: World) -> None:
    for size in (10, 200, 3000):
        chat(world, world.keys["acme"], content="y" * size)
    count, cost, _ = _ledger_totals(world, "acme")
    assert count >= 3 and cost > 0
    page = tab.login(ADMIN)
    tab.open("/console/usage?tenant=acme")
    cells = page.locator("#usage-days tbody tr").first.locator("td")
    expect(cells.nth(2)).to_have_text(str(count))
    expect(cells.nth(6)).to_have_text(f"${cost:,.6f}".rstrip("0").rstrip("."))
    chart = json.loads(page.locator("canvas[data-usage]").get_attribute("data-usage") or "{}")
    assert chart["datasets"][0]["label"] == "acme"
    assert math.isclose(sum(chart["datasets"][0]["data"]), cost, rel_tol=1e-12)
    with page.expect_download() as info:
        page.click("a.button:has-text('CSV per day')")
    text = (info.value.path()).read_text()
    (line,) = list(csv.DictReader(io.StringIO(text)))
    assert line["SubAccountId"] == "acme" and int(line["requests"]) == count
    assert math.isclose(float(line["BilledCost"]), cost, rel_tol=1e-9)


def test_route_explain_shows_the_plan_and_the_policy(tab: Tab, world: World) -> None:
    page = tab.login(ADMIN)
    tab.open("/console/routing")
    expect(page.locator("#policy-yaml")).to_contain_text("m-count")
    expect(page.locator(".state-ok")).to_have_text("valid")
    page.select_option("#explain-model", "chat")
    page.select_option("#explain-tenant", "acme")
    page.fill("#explain-prompt", "1200")
    page.click("#explain-form button[type=submit]")
    plan = page.locator("#explain-plan li")
    expect(plan).to_have_count(1)
    expect(plan.first).to_contain_text("oa/m-count")
    assert page.url.endswith("/console/routing")  # swapped in by htmx, no navigation
    tab.shot("routing-explain")
    page.fill("#explain-prompt", "lots")
    page.click("#explain-form button[type=submit]")
    expect(page.locator("#explain-result .error")).to_contain_text("prompt tokens must be")


def test_a_tenant_admin_sees_only_its_own_tenant(browser: Browser, tab: Tab, world: World) -> None:
    chat(world, world.keys["globex"], content="globex was here")
    page = tab.login(ADMIN)
    tab.open("/console/tenants/acme")
    page.fill("#key-name", "acme-console")
    page.check("#key-console")
    page.click("#create-key button[type=submit]")
    secret = page.locator("#secret").inner_text()
    chat(world, secret, content="acme was here")
    other = Tab(browser, world)
    try:
        mine = other.login(secret)
        expect(mine.locator(".badge.tenant")).to_have_text("tenant admin · acme")
        expect(mine.locator("header nav a")).to_have_count(4)  # no targets, no routing
        other.shot("tenant-admin-overview")
        other.open("/console/requests")
        tenants = mine.locator("#requests-table tbody tr td:nth-child(2)")
        expect(tenants.first).to_have_text("acme")
        assert set(tenants.all_inner_texts()) == {"acme"}
        other.shot("tenant-admin-requests")
        other.open("/console/usage")
        expect(mine.locator("#usage-days tbody tr td:nth-child(2)").first).to_have_text("acme")
        assert "globex" not in mine.locator("main").inner_text()
        for path in ["/console/tenants/globex", "/console/usage?tenant=globex",
                     "/console/targets", "/console/routing"]:  # fmt: skip
            other.open(path)
            expect(mine.locator(".error")).to_have_text("There is no such page.")
        other.open("/console/requests")  # polling, when its key is revoked elsewhere:
        revoked = world.admin("POST", f"/admin/keys/{secret.split('-')[1]}/revoke")
        assert revoked.status_code == 200
        mine.wait_for_url("**/console/login")  # the next poll ends the session
    finally:
        other.close()


def test_hostile_names_render_inert(tab: Tab, world: World) -> None:
    with pytest.raises(openai.NotFoundError):
        chat(world, ADMIN, model=XSS_MODEL)
    chat(world, ADMIN, model=XSS_ALIAS)
    page = tab.login(ADMIN)
    tab.open("/console/requests")
    expect(page.locator("td.model", has_text=XSS_MODEL)).to_have_count(1)
    expect(page.locator("td.model", has_text=XSS_ALIAS).first).to_be_visible()
    tab.open("/console/tenants")
    link = page.locator("#tenants-table a", has_text=XSS_TENANT)
    expect(link).to_have_count(1)
    link.click()
    expect(page.locator("h1")).to_have_text(f"Tenant {XSS_TENANT}")
    tab.open("/console/routing")
    expect(page.locator("#explain-model option", has_text=XSS_ALIAS)).to_have_count(1)
    for path in ["/console/requests", "/console/tenants", "/console/routing"]:
        tab.open(path)
        injected = page.eval_on_selector_all("img, svg[onload], script:not([src])", "e => e.length")
        assert injected == 0, path
    # the Tab fixture fails the test if any alert() ran


ATTACK = """<!doctype html><html><body>
<form id="f" method="post" action="{action}">
<input name="csrf_token" value="guessed"></form>
<script>document.getElementById("f").submit();</script></body></html>"""


def _attacker(action: str) -> Any:
    page = ATTACK.format(action=action).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"text/html")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": page})

    return app


def test_a_forged_cross_site_post_is_refused(tab: Tab, world: World) -> None:
    _, key_id = world.new_key("acme", name="victim")
    tab.login(ADMIN)
    attacker = ServerThread(_attacker(f"{world.url}/console/keys/{key_id}/revoke")).start()
    try:  # another port of the same host: the same site, so the cookie goes along
        page = tab.open("/console/overview")
        page.goto(attacker.url + "/")
        page.wait_for_url(f"**/console/keys/{key_id}/revoke")
        expect(page.locator(".error")).to_contain_text("Refused: the request came from another")
    finally:
        attacker.stop()
    assert world.admin("GET", f"/admin/keys/{key_id}").json()["status"] == "active"
