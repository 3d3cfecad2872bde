"""What the tenant path costs (issue 4). Not a test: it prints figures.

One run compares three gateways on the same load, each pinned to core 0 (``taskset``):

  (a) open    the plain open path: no tenants, no auth (SQLite ledger, as by default);
  (b) redis   API-key auth, quotas (rpm, tpm, concurrency, all too large to trigger) on a
              real Redis, and the Redis stream ledger;
  (c) memory  the same tenant and limits on the memory store, with the SQLite ledger;
  (d) postgres (only with ``--ledger postgres``) the fleet's setup: as (c), with the key
              managed by the control plane on Postgres (API-managed keys) and the Postgres
              ledger (group commit); a scratch database on ``--pg-dsn``, dropped at the end.

The fake upstream (``bench.fake_upstream``), ``redis-server`` and the load generator share
core 1. The load generator is this process: raw HTTP/1.1 keep-alive connections in a closed
loop (``bench.rawclient``), because ``wrk`` may be missing. For each gateway it reports the
gateway process's CPU time per request (utime + stime over the measured window, its
threads included: the SQLite writer, the Redis client), the requests/s it served (bounded
by core 1 when the generator saturates it), the one-core capacity that its CPU cost implies
(1000 / CPU ms), and the extra CPU per request of (b) and (c) over (a). Redis' own CPU per
request is printed next to (b): it is not on the gateway's core but is part of the cost.

Scenarios run in rounds (a, b, c, a, b, c, ...) so a noisy neighbour hurts all alike; the
figure kept is each scenario's median over the rounds.

Postgres' own CPU is not counted: it is a shared server outside the bench's cores.

``--profile redis|memory|open|postgres`` instead runs that gateway under cProfile for one measured
window and prints where its time goes.

Run: .venv/bin/python -m bench.tenant_path [--seconds 6] [--rounds 2] [--connections 32]
     [--ledger postgres [--pg-dsn "host=127.0.0.1 user=postgres dbname=postgres"]]
Loopback only; stops by itself (every wait is bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.gateway import cpu_seconds, wait_http
from bench.rawclient import Connection
from policies.auth import KeysFile
from tests.fixtures.postgres_server import SHARED_DSN, scratch_database
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.server import free_port

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
GATEWAY_CORE, LOAD_CORE = 0, 1
BODY = json.dumps(
    {
        "model": "bench",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello in a friendly way, please."},
        ],
        "max_tokens": 64,
    }
).encode()
HUGE = 1_000_000_000  # limits that never trigger, yet are checked on every request
SCENARIOS = ("open", "redis", "memory")
PG_SCENARIO = "postgres"  # added by --ledger postgres
TARGET_EXTRA_MS = 0.5


@dataclass
class Result:
    rps: float
    cpu_ms: float
    redis_cpu_ms: float = 0.0


def config_text(
    scenario: str, up_port: int, folder: Path, redis_url: str, pg_dsn: str | None = None
) -> str:
    """The policy file of one scenario (see the module docstring)."""
    common = (
        "logging: {level: info, json: true}\n"
        "server: {watch_config: false}\n"
        "providers:\n"
        f"  up: {{type: openai, base_url: 'http://127.0.0.1:{up_port}/v1', api_key_env: BENCH_KEY}}\n"
        "models:\n  bench: {targets: [{provider: up, model: bench-model}]}\n"
    )
    if scenario == "open":
        return common + f"ledger: {{backend: sqlite, path: {folder / 'open.sqlite3'}}}\n"
    tenant = (
        f"auth: {{keys_file: {folder / 'keys.json'}}}\n"
        f"tenants:\n  bench: {{limits: {{rpm: {HUGE}, tpm: {HUGE}, concurrency: {HUGE}}}}}\n"
    )
    if scenario == "redis":
        return (
            common
            + tenant
            + (
                f"state: {{backend: redis, redis: {{url: '{redis_url}', key_prefix: 'bench:'}}}}\n"
                f"ledger: {{backend: redis, spool_path: {folder / 'spool.sqlite3'}}}\n"
            )
        )
    if scenario == PG_SCENARIO:
        spool = folder / "pg-spool.sqlite3"
        return (
            common
            + tenant
            + f"ledger: {{backend: postgres, dsn: '{pg_dsn}', spool_path: {spool}}}\n"
            # the fleet's control plane: the keys file is imported into it at start and
            # the key is checked against its in-memory index (polled from Postgres)
            + f"control: {{backend: postgres, dsn: '{pg_dsn}'}}\n"
        )
    return common + tenant + f"ledger: {{backend: sqlite, path: {folder / 'memory.sqlite3'}}}\n"


def raw_request(key: str | None) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\n{auth}content-length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


async def closed_loop(port: int, raw: bytes, connections: int, seconds: float) -> int:
    """``connections`` keep-alive connections, each sending the next request as soon as
    the previous answer is read, for ``seconds``. Returns how many completed; raises on
    any status but 200."""
    conns = [await Connection.open(port) for _ in range(connections)]
    end = time.perf_counter() + seconds
    done = 0

    async def worker(conn: Connection) -> None:
        nonlocal done
        while time.perf_counter() < end:
            status, _, _ = await asyncio.wait_for(conn.request(raw), 30)
            if status != 200:
                raise RuntimeError(f"gateway answered {status}")
            done += 1

    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for conn in conns:
            conn.close()
    return done


def start_gateway(
    config: Path, port: int, log: Path, profile: Path | None
) -> subprocess.Popen[bytes]:
    runner = [PY, "-m", "cProfile", "-o", str(profile)] if profile else [PY]
    cmd = [*runner, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    return subprocess.Popen(
        ["taskset", "-c", str(GATEWAY_CORE), *cmd],
        cwd=ROOT,
        env={**os.environ, "BENCH_KEY": "sk-bench"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the gateway drains and exits); SIGKILL if it is still there after 20 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@dataclass
class Bench:
    args: argparse.Namespace
    folder: Path
    up_port: int
    redis: RedisServer
    key: str
    pg_dsn: str | None = None

    def measure(self, scenario: str, profile: Path | None = None) -> Result:
        config = self.folder / f"{scenario}.yaml"
        config.write_text(
            config_text(scenario, self.up_port, self.folder, self.redis.url, self.pg_dsn)
        )
        port = free_port()
        log = self.folder / f"{scenario}.log"
        proc = start_gateway(config, port, log, profile)
        raw = raw_request(None if scenario == "open" else self.key)
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz")
            worker = psutil.Process(proc.pid)
            redis_proc = psutil.Process(self.redis.proc.pid) if self.redis.proc else None
            asyncio.run(closed_loop(port, raw, self.args.connections, 1.5))  # warm-up
            cpu0, redis0, t0 = cpu_seconds(worker), self._redis_cpu(redis_proc), time.perf_counter()
            done = asyncio.run(closed_loop(port, raw, self.args.connections, self.args.seconds))
            elapsed = time.perf_counter() - t0
            cpu_ms = (cpu_seconds(worker) - cpu0) / done * 1000
            redis_ms = (self._redis_cpu(redis_proc) - redis0) / done * 1000
        except BaseException:
            print(log.read_text()[-2000:], file=sys.stderr)
            raise
        finally:
            stop(proc)
        return Result(done / elapsed, cpu_ms, redis_ms if scenario == "redis" else 0.0)

    @staticmethod
    def _redis_cpu(process: psutil.Process | None) -> float:
        return cpu_seconds(process) if process is not None else 0.0


def report(results: dict[str, list[Result]]) -> None:
    median = {s: statistics.median(r.cpu_ms for r in rs) for s, rs in results.items()}
    print(
        f"{'gateway':8s} {'CPU ms/req':>10s} {'extra ms':>9s} {'served req/s':>13s} "
        f"{'1-core cap req/s':>17s}  rounds (CPU ms)"
    )
    for scenario, runs in results.items():
        extra = median[scenario] - median["open"]
        rps = statistics.median(r.rps for r in runs)
        line = (
            f"{scenario:8s} {median[scenario]:10.3f} {extra:+9.3f} {rps:13.0f} "
            f"{1000 / median[scenario]:17.0f}  " + ", ".join(f"{r.cpu_ms:.3f}" for r in runs)
        )
        if scenario == "redis":
            line += f"; redis-server {statistics.median(r.redis_cpu_ms for r in runs):.3f} ms/req"
        print(line)
    letters = {"redis": "b", "memory": "c", PG_SCENARIO: "d"}
    for scenario in (s for s in results if s != "open"):
        extra = median[scenario] - median["open"]
        verdict = "within" if extra <= TARGET_EXTRA_MS else "OVER"
        print(
            f"extra CPU of ({letters[scenario]}) {scenario} over (a) open: "
            f"{extra:.3f} ms/request ({verdict} the {TARGET_EXTRA_MS} ms target)"
        )


# The tenant path's own pieces, for the focused view of a profile.
_TENANT_PATH = (
    r"(pipeline|manager|checks|redis_stream|spool|sqlite|postgres|authenticator|keys|redis)\.py"
)


def print_profile(path: Path, limit: int) -> None:
    """Where the time goes: by own time, then the tenant path's pieces by cumulative time.
    (cProfile counts every resumption of a coroutine as a call, so ``ncalls`` of async
    functions overstate the number of requests.)"""
    stats = pstats.Stats(str(path))
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(_TENANT_PATH, limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--profile", choices=(*SCENARIOS, PG_SCENARIO))
    parser.add_argument("--ledger", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-dsn", default=SHARED_DSN, help="server for --ledger postgres")
    args = parser.parse_args()
    os.sched_setaffinity(0, {LOAD_CORE})  # the load generator stays off the gateway's core
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tenant-"))
        pg_dsn = None
        if args.ledger == "postgres" or args.profile == PG_SCENARIO:
            pg_dsn = stack.enter_context(scratch_database(args.pg_dsn))
        run(args, Path(tmp), pg_dsn)


def run(args: argparse.Namespace, folder: Path, pg_dsn: str | None) -> None:
    """The measurements (or the profile) of one bench run, in ``folder``."""
    key, _ = KeysFile(folder / "keys.json").create("bench", "bench")
    redis = RedisServer().start()
    up_port = free_port()
    upstream = subprocess.Popen(
        ["taskset", "-c", str(LOAD_CORE), PY, "-m", "bench.fake_upstream", str(up_port)],
        cwd=ROOT,
    )
    try:
        assert redis.proc is not None
        os.sched_setaffinity(redis.proc.pid, {LOAD_CORE})
        wait_http(f"http://127.0.0.1:{up_port}/healthz")
        bench = Bench(args, folder, up_port, redis, key, pg_dsn)
        if args.profile:
            out = folder / "profile.out"
            bench.measure(args.profile, profile=out)
            print_profile(out, 30)
            return
        scenarios = (*SCENARIOS, PG_SCENARIO) if pg_dsn else SCENARIOS
        results: dict[str, list[Result]] = {s: [] for s in scenarios}
        for _ in range(args.rounds):
            for scenario in scenarios:
                results[scenario].append(bench.measure(scenario))
        print(
            f"{args.connections} connections, {args.seconds:.0f} s per run, "
            f"{args.rounds} rounds; gateway on core {GATEWAY_CORE}, load on core {LOAD_CORE}"
        )
        report(results)
    finally:
        upstream.terminate()
        upstream.wait(10)
        redis.close()


if __name__ == "__main__":
    main()
