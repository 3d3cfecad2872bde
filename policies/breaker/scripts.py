"""The breaker's atomic store operations: Lua bodies (Redis) and Python twins (memory),
both applying the rules of ``machine`` to one hash per target.

RECORD KEYS: the target's key.  ARGV: now, outcomes (a string of s|f|n, oldest first),
       then the config (below). Applies the outcomes in order; returns the hash after them
       as a flat [field, value, ...] list.
PROBE  KEYS: the target's key.  ARGV: now, then the config.
       Takes a half-open probe slot if one is free; returns [ok (1|0), field, value, ...].
READ   KEYS: any number of target keys.  ARGV: none.
       Returns one flat field list per key (empty for a target with no state).

Config ARGV, in order: failure_rate, window_s, min_calls, consecutive_failures,
cooldown_s, half_open_probes, buckets, ttl_s. Values come back as strings (Lua would
truncate floats to integers); ``parse_fields`` reads either backend's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.config_routing import BreakerConfig
from policies.breaker.machine import (
    BUCKETS,
    Fields,
    Outcome,
    acquire_probe,
    current_state,
    record,
)
from policies.store.base import MemoryData, Script, Value

_PRELUDE = """
local CLOSED, OPEN, HALF = 0, 1, 2
local function cfg(a)
  return {rate = tonumber(ARGV[a]), window = tonumber(ARGV[a + 1]),
          min_calls = tonumber(ARGV[a + 2]), consec = tonumber(ARGV[a + 3]),
          cooldown = tonumber(ARGV[a + 4]), probes = tonumber(ARGV[a + 5]),
          buckets = tonumber(ARGV[a + 6]), ttl = tonumber(ARGV[a + 7])}
end
local function load(key)
  local f = {}
  local raw = redis.call('HGETALL', key)
  for i = 1, #raw, 2 do f[raw[i]] = tonumber(raw[i + 1]) end
  return f
end
local function save(key, f, ttl)
  redis.call('DEL', key)
  local flat = {}
  for k, v in pairs(f) do
    flat[#flat + 1] = k
    flat[#flat + 1] = tostring(v)
  end
  if #flat > 0 then
    redis.call('HSET', key, unpack(flat))
    redis.call('PEXPIRE', key, math.ceil(ttl * 1000))
  end
  return flat
end
local function state_of(f, c, now)
  local s = f.s or CLOSED
  if s == OPEN and now - (f.t or 0) >= c.cooldown then
    f.s = HALF
    f.p = 0
    s = HALF
  end
  return s
end
local function epoch(c, now) return math.floor(now / (c.window / c.buckets)) end
local function counts(f, c, now)
  local e = epoch(c, now)
  local calls, fails = 0, 0
  for i = 0, c.buckets - 1 do
    local seen = f['e' .. i]
    if seen and e - seen < c.buckets then
      calls = calls + (f['n' .. i] or 0)
      fails = fails + (f['f' .. i] or 0)
    end
  end
  return calls, fails
end
local function reset(f, c)
  for i = 0, c.buckets - 1 do
    f['e' .. i] = nil
    f['n' .. i] = nil
    f['f' .. i] = nil
  end
  f.c = 0
end
local function trip(f, c, now)
  reset(f, c)
  f.s = OPEN
  f.t = now
  f.p = 0
end
"""

RECORD_LUA = (
    _PRELUDE
    + """
local function apply(f, c, now, outcome)
  local s = state_of(f, c, now)
  if outcome == 'n' then
    if s == HALF then f.p = math.max(0, (f.p or 0) - 1) end
  elseif s == HALF then
    if outcome == 's' then
      reset(f, c)
      f.s = CLOSED
      f.p = 0
    else
      trip(f, c, now)
    end
  elseif s == CLOSED then
    local failed = 0
    if outcome == 'f' then failed = 1 end
    local e = epoch(c, now)
    local i = e % c.buckets
    if f['e' .. i] ~= e then
      f['e' .. i] = e
      f['n' .. i] = 0
      f['f' .. i] = 0
    end
    f['n' .. i] = f['n' .. i] + 1
    f['f' .. i] = f['f' .. i] + failed
    if failed == 0 then
      f.c = 0
    else
      f.c = (f.c or 0) + 1
      local calls, fails = counts(f, c, now)
      if f.c >= c.consec or (calls >= c.min_calls and fails >= c.rate * calls) then
        trip(f, c, now)
      end
    end
  end
end
local key, now, codes = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local c = cfg(3)
local f = load(key)
for k = 1, #codes do apply(f, c, now, string.sub(codes, k, k)) end
return save(key, f, c.ttl)
"""
)

PROBE_LUA = (
    _PRELUDE
    + """
local key, now = KEYS[1], tonumber(ARGV[1])
local c = cfg(2)
local f = load(key)
local s = state_of(f, c, now)
local ok = 0
if s == CLOSED then
  ok = 1
elseif s == HALF then
  local out = f.p or 0
  if out >= c.probes and now - (f.q or 0) >= c.cooldown then out = 0 end
  if out < c.probes then
    f.p = out + 1
    f.q = now
    ok = 1
  else
    f.p = out
  end
end
local flat = save(key, f, c.ttl)
table.insert(flat, 1, ok)
return flat
"""
)

READ_LUA = """
local out = {}
for i = 1, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
"""

_OUTCOME_CODES: dict[Outcome, str] = {"success": "s", "failure": "f", "neutral": "n"}
_OUTCOMES: dict[str, Outcome] = {code: name for name, code in _OUTCOME_CODES.items()}


def config_args(config: BreakerConfig, ttl_s: float) -> list[Value]:
    """The config part of ARGV (see the module docstring for the order)."""
    return [
        config.failure_rate,
        config.window_s,
        config.min_calls,
        config.consecutive_failures,
        config.cooldown_s,
        config.half_open_probes,
        BUCKETS,
        ttl_s,
    ]


def record_args(
    now: float, outcomes: Sequence[Outcome], config: BreakerConfig, ttl_s: float
) -> list[Value]:
    codes = "".join(_OUTCOME_CODES[outcome] for outcome in outcomes)
    return [now, codes, *config_args(config, ttl_s)]


def _config_from(args: Sequence[Value]) -> tuple[BreakerConfig, float]:
    rate, window, min_calls, consec, cooldown, probes, _buckets, ttl = args
    config = BreakerConfig(
        failure_rate=float(rate),
        window_s=float(window),
        min_calls=int(min_calls),
        consecutive_failures=int(consec),
        cooldown_s=float(cooldown),
        half_open_probes=int(probes),
    )
    return config, float(ttl)


def _flat(f: Fields) -> list[str]:
    return [item for name, value in f.items() for item in (name, repr(value))]


def _save(data: MemoryData, key: str, f: Fields, ttl_s: float) -> list[str]:
    if f:
        data.set(key, f)
        data.expire(key, ttl_s)
    return _flat(f)


def _record_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    del now  # the caller's time travels in ARGV[1] on both backends
    config, ttl = _config_from(args[2:])
    f: Fields = dict(data.get(keys[0]) or {})
    for code in str(args[1]):
        record(f, config, float(args[0]), _OUTCOMES[code])
    return _save(data, keys[0], f, ttl)


def _probe_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    del now
    config, ttl = _config_from(args[1:])
    f: Fields = dict(data.get(keys[0]) or {})
    at = float(args[0])
    current_state(f, config, at)
    ok = acquire_probe(f, config, at)
    return [1 if ok else 0, *_save(data, keys[0], f, ttl)]


def _read_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    del args, now
    return [_flat(dict(data.get(key) or {})) for key in keys]


RECORD = Script("breaker_record", RECORD_LUA, _record_python)
PROBE = Script("breaker_probe", PROBE_LUA, _probe_python)
READ = Script("breaker_read", READ_LUA, _read_python)


def parse_fields(flat: Sequence[Any]) -> Fields:
    """A flat [field, value, ...] answer (bytes from Redis, str from memory) as Fields."""
    fields: Fields = {}
    for i in range(0, len(flat) - 1, 2):
        name, value = flat[i], flat[i + 1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        fields[name] = float(value)
    return fields
