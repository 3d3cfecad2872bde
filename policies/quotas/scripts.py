"""The two atomic quota operations, each a Lua body (Redis) with a Python twin (memory).

A *check* is one limit of one scope, encoded as one key plus a few ARGV fields:

- kind ``n``: an integer counter of the current fixed window (requests, tokens);
- kind ``f``: a float counter of the current window (USD per day / month);
- kind ``c``: a concurrency lease set: request id -> lease expiry (a sorted set on Redis).
  Expired leases are dropped on every admission, so a replica that crashes while holding
  slots leaks them for at most ``lease_s`` (the whole key also expires ``lease_s`` after
  its last write).

ADMIT  KEYS: one per check.  ARGV: now, request_id, then per check: kind, limit, amount, ttl_s
       (``ttl_s`` is the counter key's TTL; for kind ``c`` it is the lease length).
       All-or-nothing: every check is evaluated; only when all fit are all applied.
       Returns ``[ok (1|0), used_1, ..., used_n]``: usage after the reservation when ok,
       else the usage found; usage values are strings (Lua would truncate floats).
SETTLE KEYS: two per check: the window key reserved at admission, the current window key
       (the same key for kind ``c``).  ARGV: request_id, then per check: kind, delta, ttl_s.
       ``delta`` = actual - reserved. Same window: add it (a refund never takes a counter
       below 0, and is skipped when the counter is gone). Window already over: a positive
       delta is charged to the current window as debt, a refund is dropped (it cannot hand
       out capacity in a window it was never charged to). Kind ``c`` releases the lease.
       Returns 1.

PEEK   KEYS: one per check.  ARGV: now, then per check: kind. Read-only: returns the usage of
       each check as a string (live leases for kind ``c``, the counter otherwise; 0 for a
       missing key).

Both bodies compare with ``used + amount <= limit + 1e-9`` exactly as ``windows.fits`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.quotas.windows import fits
from policies.store.base import MemoryData, Script, Value

ADMIT_LUA = """
local now = tonumber(ARGV[1])
local rid = ARGV[2]
local n = #KEYS
local used, ok = {}, 1
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local kind, limit, amount = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local u
  if kind == 'c' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    u = redis.call('ZCARD', KEYS[i])
    if redis.call('ZSCORE', KEYS[i], rid) then amount = 0 end
  else
    u = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  used[i] = u
  if u + amount > limit + 1e-9 then ok = 0 end
end
if ok == 1 then
  for i = 1, n do
    local b = 2 + (i - 1) * 4
    local kind, amount, ttl = ARGV[b + 1], ARGV[b + 3], tonumber(ARGV[b + 4])
    if kind == 'c' then
      if redis.call('ZADD', KEYS[i], now + ttl, rid) == 1 then used[i] = used[i] + 1 end
    elseif kind == 'f' then
      used[i] = tonumber(redis.call('INCRBYFLOAT', KEYS[i], amount))
    else
      used[i] = redis.call('INCRBY', KEYS[i], amount)
    end
    redis.call('PEXPIRE', KEYS[i], math.ceil(ttl * 1000))
  end
end
local out = {ok}
for i = 1, n do out[i + 1] = tostring(used[i]) end
return out
"""

SETTLE_LUA = """
local rid = ARGV[1]
for i = 1, #KEYS / 2 do
  local orig, cur = KEYS[2 * i - 1], KEYS[2 * i]
  local b = 1 + (i - 1) * 3
  local kind, delta, ttl = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  if kind == 'c' then
    redis.call('ZREM', orig, rid)
  else
    local target = nil
    if delta > 0 then
      target = cur
    elseif delta < 0 and orig == cur and redis.call('EXISTS', orig) == 1 then
      target = orig
    end
    if target then
      local v
      if kind == 'f' then
        v = tonumber(redis.call('INCRBYFLOAT', target, ARGV[b + 2]))
      else
        v = redis.call('INCRBY', target, ARGV[b + 2])
      end
      if v < 0 then redis.call('SET', target, '0') end
      redis.call('PEXPIRE', target, math.ceil(ttl * 1000))
    end
  end
end
return 1
"""

PEEK_LUA = """
local now = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  if ARGV[1 + i] == 'c' then
    out[i] = tostring(redis.call('ZCOUNT', KEYS[i], '(' .. now, '+inf'))
  else
    out[i] = tostring(tonumber(redis.call('GET', KEYS[i]) or '0'))
  end
end
return out
"""


def _number(kind: Value, raw: Value) -> float:
    return int(raw) if kind == "n" else float(raw)


def _leases(data: MemoryData, key: str, now: float) -> dict[str, float]:
    """The live leases of a concurrency set (expired ones dropped, as ZREMRANGEBYSCORE)."""
    leases: dict[str, float] = data.get(key) or {}
    for rid in [r for r, until in leases.items() if until <= now]:
        del leases[rid]
    return leases


def _admit_check(
    data: MemoryData, key: str, fields: Sequence[Value], rid: str, now: float
) -> tuple[float, bool]:
    """(usage found, whether the amount fits) for one check; mutates nothing but
    expired leases."""
    kind, limit, amount = fields[0], float(fields[1]), _number(fields[0], fields[2])
    if kind == "c":
        leases = _leases(data, key, now)
        return len(leases), fits(len(leases), 0 if rid in leases else 1, limit)
    used = data.get(key) or 0
    return used, fits(used, amount, limit)


def _admit_apply(
    data: MemoryData, key: str, fields: Sequence[Value], rid: str, now: float
) -> float:
    kind, amount, ttl = fields[0], _number(fields[0], fields[2]), float(fields[3])
    if kind == "c":
        leases = _leases(data, key, now)
        leases[rid] = now + ttl
        data.set(key, leases)
        used: float = len(leases)
    else:
        used = (data.get(key) or 0) + amount
        data.set(key, used)
    data.expire(key, ttl)
    return used


def admit_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    """The Python twin of ``ADMIT_LUA`` (``now`` from ARGV, like the Lua body)."""
    del now  # the caller's time travels in ARGV[1] on both backends
    at, rid = float(args[0]), str(args[1])
    per = [args[2 + i * 4 : 6 + i * 4] for i in range(len(keys))]
    found = [_admit_check(data, key, f, rid, at) for key, f in zip(keys, per, strict=True)]
    ok = all(fit for _, fit in found)
    used = [u for u, _ in found]
    if ok:
        used = [_admit_apply(data, key, f, rid, at) for key, f in zip(keys, per, strict=True)]
    return [int(ok), *(str(u) for u in used)]


def _settle_one(data: MemoryData, orig: str, cur: str, fields: Sequence[Value], rid: str) -> None:
    kind, delta, ttl = fields[0], _number(fields[0], fields[1]), float(fields[2])
    if kind == "c":
        leases = data.get(orig)
        if leases is not None:
            leases.pop(rid, None)
        return
    target = None
    if delta > 0:
        target = cur
    elif delta < 0 and orig == cur and data.get(orig) is not None:
        target = orig
    if target is not None:
        data.set(target, max(0, (data.get(target) or 0) + delta))
        data.expire(target, ttl)


def settle_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    """The Python twin of ``SETTLE_LUA``."""
    del now
    rid = str(args[0])
    for i in range(len(keys) // 2):
        _settle_one(data, keys[2 * i], keys[2 * i + 1], args[1 + i * 3 : 4 + i * 3], rid)
    return 1


def peek_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    """The Python twin of ``PEEK_LUA``: reads only (expired leases are not counted)."""
    del now
    at = float(args[0])
    out = []
    for key, kind in zip(keys, args[1:], strict=True):
        value = data.get(key)
        if kind == "c":
            out.append(str(sum(1 for until in (value or {}).values() if until > at)))
        else:
            out.append(str(value or 0))
    return out


ADMIT = Script("quota_admit", ADMIT_LUA, admit_python)
PEEK = Script("quota_peek", PEEK_LUA, peek_python)
SETTLE = Script("quota_settle", SETTLE_LUA, settle_python)
