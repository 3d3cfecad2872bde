"""Worker discovery's DNS side against a real DNS server on loopback (dnslib): what each kind
of answer becomes, and the loop that re-resolves names and hands the addresses on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from core.clock import SystemClock
from core.config_discovery import DiscoveryConfig
from local_tier.discovery import Discovery, DnsResolver, Empty, Failed, Found
from tests.fixtures.dns_server import DnsServer, Zone, dns_server

NAME = "workers.ns.svc.cluster.local"


@pytest.fixture
def server() -> Iterator[DnsServer]:
    with dns_server() as running:
        yield running


def settings(server: DnsServer, **fields: float) -> DiscoveryConfig:
    values: dict[str, float] = {"timeout_s": 1.0, **fields}
    return DiscoveryConfig(nameservers=[server.nameserver], **values)  # type: ignore[arg-type]


def lookup(server: DnsServer, name: str = NAME, timeout_s: float = 1.0) -> object:
    return asyncio.run(DnsResolver(settings(server, timeout_s=timeout_s)).lookup(name))


def test_a_and_aaaa_records_are_found_together(server: DnsServer) -> None:
    server.zone.set(NAME, ["10.0.0.3", "fd00::7", "10.0.0.2"])
    assert lookup(server) == Found(("10.0.0.2", "10.0.0.3", "fd00::7"))
    assert lookup(server, NAME.upper() + ".") == Found(("10.0.0.2", "10.0.0.3", "fd00::7"))


def test_no_such_name_and_no_records_are_empty_answers(server: DnsServer) -> None:
    assert lookup(server) == Empty("NXDOMAIN")
    server.zone.set(NAME, [])
    assert lookup(server) == Empty("no A/AAAA record")


@pytest.mark.parametrize("mode", ["servfail", "silent"])
def test_servfail_and_silence_are_failures(server: DnsServer, mode: str) -> None:
    server.zone.set(NAME, ["10.0.0.2"])
    server.zone.mode = mode  # type: ignore[assignment]
    outcome = lookup(server, timeout_s=0.3)
    assert isinstance(outcome, Failed)
    expected = "NoNameservers" if mode == "servfail" else "LifetimeTimeout"
    assert expected in outcome.error


def test_a_stopped_server_is_a_failure(server: DnsServer) -> None:
    server.zone.set(NAME, ["10.0.0.2"])
    server.stop()
    outcome = lookup(server, timeout_s=0.5)
    assert isinstance(outcome, Failed)


def test_refresh_follows_the_answers_and_keeps_them_through_an_outage(server: DnsServer) -> None:
    async def scenario() -> None:
        discovery = Discovery(SystemClock())
        discovery.configure({NAME: settings(server, empty_after=2)})
        assert discovery.addresses() == {NAME: ()}

        server.zone.set(NAME, ["10.0.0.2"])
        (change,) = await discovery.refresh()
        assert (change.added, change.removed) == (("10.0.0.2",), ())

        server.zone.set(NAME, ["10.0.0.2", "10.0.0.3"])
        (change,) = await discovery.refresh()
        assert change.added == ("10.0.0.3",)
        assert await discovery.refresh() == []  # same answer: no change

        server.zone.mode = "servfail"
        assert await discovery.refresh() == []
        assert await discovery.refresh() == []
        assert discovery.addresses() == {NAME: ("10.0.0.2", "10.0.0.3")}
        assert discovery.status()[NAME]["failures"] == 2

        server.zone.mode = "answer"
        server.zone.remove(NAME)
        assert await discovery.refresh() == []  # the first empty answer keeps them
        (change,) = await discovery.refresh()
        assert change.removed == ("10.0.0.2", "10.0.0.3")
        assert discovery.addresses() == {NAME: ()}

    asyncio.run(scenario())


def test_configure_keeps_known_addresses_and_drops_names_no_longer_used(
    server: DnsServer,
) -> None:
    async def scenario() -> None:
        discovery = Discovery(SystemClock())
        discovery.configure({NAME: settings(server)})
        server.zone.set(NAME, ["10.0.0.2"])
        await discovery.refresh()
        # a changed setting (a reload): same addresses until the next lookup
        discovery.configure({NAME: settings(server, interval_s=1), "other.svc": settings(server)})
        assert discovery.addresses() == {NAME: ("10.0.0.2",), "other.svc": ()}
        discovery.configure({"other.svc": settings(server)})
        assert discovery.names() == ["other.svc"]

    asyncio.run(scenario())


def test_the_loop_resolves_when_due_and_hands_every_round_on(server: DnsServer) -> None:
    """``run`` looks names up on their interval and calls ``apply`` after each round; a new
    name configured while it sleeps is looked up at once."""
    seen: list[dict[str, tuple[str, ...]]] = []

    async def scenario() -> None:
        discovery: Discovery

        async def apply() -> None:
            seen.append(discovery.addresses())

        discovery = Discovery(SystemClock(), apply)
        discovery.configure({NAME: settings(server, interval_s=0.05)})
        server.zone.set(NAME, ["10.0.0.2"])
        server.zone.set("late.svc", ["10.0.0.9"])
        task = asyncio.create_task(discovery.run())
        try:
            await _until(lambda: bool(seen) and seen[-1] == {NAME: ("10.0.0.2",)})
            server.zone.set(NAME, ["10.0.0.2", "fd00::3"])
            await _until(lambda: seen[-1] == {NAME: ("10.0.0.2", "fd00::3")})
            # a name added by a reload, with an interval far longer than the test
            discovery.configure(
                {
                    NAME: settings(server, interval_s=0.05),
                    "late.svc": settings(server, interval_s=3600),
                }
            )
            await _until(lambda: seen[-1].get("late.svc") == ("10.0.0.9",))
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


async def _until(condition: object, limit_s: float = 10.0) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_the_zone_fixture_answers_only_the_family_asked(server: DnsServer) -> None:
    zone: Zone = server.zone
    zone.set(NAME, ["fd00::1"])
    assert lookup(server) == Found(("fd00::1",))
    assert zone.queries >= 2  # A and AAAA were both asked
