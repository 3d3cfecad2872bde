"""Figures from policy runs: per-seed metrics, aggregates over seeds, the table, verdicts.

Contract (all pure):
- ``run_metrics(run)`` -> a JSON-able dict for one (seed, feed, policy). Cost is the
  upstreams' own records x their prices (prompt tokens of every accepted request, also
  cancelled or hung ones; completion tokens as sent). Attainment per class counts an error
  as a miss; ``overall`` is over every request with an objective. Goodput = requests that
  met their objective (no objective: any successful answer) per second of trace span.
  ``outage`` = attainment of requests with an objective that arrived inside the window.
- ``aggregate(metrics)`` -> per (feed, policy): means over seeds, SE across seeds (None
  with one seed) and the pooled binomial SE.
  ``objective_met`` lists ``(block, met)`` per request with an objective, in trace order
  (``bench.routing_e2e.paired``); ``misses`` the ``(index, kind)`` of each that missed
  (``miss_kinds``; paired across policies by ``bench.routing_e2e.excess``).
- ``verdicts(agg, metrics)`` -> per feed: slo vs priority, saving and attainment
  difference against its SE, paired request by request and clustered in blocks of trace
  time (``bench.routing_e2e.paired``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from typing import Any

from bench.routing_e2e.menu import MENU, ORDER
from bench.routing_e2e.paired import BLOCK_S, block_of, clustered_difference
from bench.routing_e2e.runner import PolicyRun
from bench.routing_e2e.workload import NOMINAL_NONE_MS, OBJECTIVE_MS

OBJECTIVE_CLASSES = ("chat-800ms", "chat-3s", "rag-3s")
TARGET_SAVING = 0.40


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _att(met: int, n: int) -> dict[str, Any]:
    p = met / n if n else None
    se = math.sqrt(p * (1 - p) / n) if p is not None and n else None
    return {"n": n, "met": met, "attainment": p, "se_binom": se}


def _met(run: PolicyRun, i: int, limit_ms: float | None) -> bool:
    out = run.outcomes[i]
    if not out.ok or out.ttft_s is None:
        return False
    return limit_ms is None or out.ttft_s * 1000 <= limit_ms


STARTUP_S = 15.0  # the gateway is still learning its targets
KINDS = ("start-up", "after a cut", "first attempt")


def miss_kinds(run: PolicyRun) -> list[tuple[int, str]]:
    """``(index, kind)`` of each request that missed its objective, in trace order: kind
    is ``start-up`` (arrived in the first ``STARTUP_S`` seconds), ``after a cut`` (served,
    or failed, on a later attempt: the first was cut or failed) or ``first attempt``."""
    out = []
    for i, req in enumerate(run.trace):
        if req.slo_ttft_ms is None or _met(run, i, req.slo_ttft_ms):
            continue
        if req.at_s < STARTUP_S:
            kind = KINDS[0]
        else:
            kind = KINDS[1] if (run.outcomes[i].attempts or 1) > 1 else KINDS[2]
        out.append((req.index, kind))
    return out


def _upstreams(run: PolicyRun) -> tuple[float, dict[str, Any]]:
    total, per = 0.0, {}
    for name in ORDER:
        stats = run.upstreams[name]
        prompt = sum(s.prompt_tokens for s in stats.served)
        done = sum(s.completion_tokens for s in stats.served)
        cost = MENU[name].cost_usd(prompt, done)
        total += cost
        kinds = Counter(s.outcome for s in stats.served)
        per[name] = {
            "accepted": len(stats.served),
            "rejected_429": stats.rejected,
            "hung": kinds["hung"],
            "cancelled": kinds["cancelled"],
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "cost_usd": cost,
            "high_water": stats.high_water,
            "connections": stats.connections,
        }
    return total, per


def run_metrics(run: PolicyRun) -> dict[str, Any]:
    """The figures of one policy run (see the module contract)."""
    trace, outs = run.trace, run.outcomes
    n = len(trace)
    cost, ups = _upstreams(run)
    classes = {}
    for name in OBJECTIVE_CLASSES:
        idx = [i for i, r in enumerate(trace) if r.slo_class == name]
        classes[name] = _att(sum(_met(run, i, OBJECTIVE_MS[name]) for i in idx), len(idx))
    with_obj = [i for i, r in enumerate(trace) if r.slo_ttft_ms is not None]
    met = sum(_met(run, i, trace[i].slo_ttft_ms) for i in with_obj)
    classes["overall"] = _att(met, len(with_obj))
    none = [i for i, r in enumerate(trace) if r.slo_ttft_ms is None]
    none_ttft = [outs[i].ttft_s for i in none if outs[i].ok and outs[i].ttft_s is not None]
    classes["none"] = {
        **_att(sum(_met(run, i, NOMINAL_NONE_MS) for i in none), len(none)),
        "nominal_ms": NOMINAL_NONE_MS,
        "ttft_p50_s": _pct([t for t in none_ttft if t is not None], 0.5),
    }
    lo, hi = run.outage
    in_window = [i for i in with_obj if lo <= trace[i].at_s < hi]
    ttfts = [o.ttft_s for o in outs if o.ok and o.ttft_s is not None]
    served_by = Counter(o.provider or "-" for o in outs if o.ok)
    errors = [o.error or f"status {o.status}" for o in outs if not o.ok]
    return {
        "seed": run.seed,
        "feed": run.feed,
        "policy": run.policy,
        "requests": n,
        "span_s": run.span_s,
        "errors": len(errors),
        "error_kinds": dict(Counter(e[:200] for e in errors).most_common(8)),
        "cost_usd": cost,
        "cost_per_1k": cost / n * 1000 if n else 0.0,
        "classes": classes,
        "ttft_s": {q: _pct([t for t in ttfts if t is not None], v) for q, v in _QS},
        "share": {name: served_by[name] / n for name in ORDER} if n else {},
        "goodput_rps": (met + sum(_met(run, i, None) for i in none)) / run.span_s,
        "outage": {
            "window_s": [lo, hi],
            **_att(sum(_met(run, i, trace[i].slo_ttft_ms) for i in in_window), len(in_window)),
        },
        "objective_met": [
            (block_of(trace[i].at_s), _met(run, i, trace[i].slo_ttft_ms)) for i in with_obj
        ],
        "misses": miss_kinds(run),
        "fallbacks": sum(1 for o in outs if (o.attempts or 1) > 1),
        "upstreams": ups,
        "harness_loop_lag_s": run.loop_lag_s,
    }


_QS = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _mean_se(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None
    return mean, se


def _pooled(runs: list[dict[str, Any]], cls: str, key: str = "classes") -> dict[str, Any]:
    block = [r[key][cls] if key == "classes" else r[key] for r in runs]
    values = [b["attainment"] for b in block if b["attainment"] is not None]
    mean, se_seeds = _mean_se(values)
    pooled = _att(sum(b["met"] for b in block), sum(b["n"] for b in block))
    return {"mean": mean, "se_seeds": se_seeds, "se_binom": pooled["se_binom"], "n": pooled["n"]}


def aggregate(metrics: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``feed/policy``: means over seeds with their SEs (see the module contract)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for m in metrics:
        groups.setdefault(f"{m['feed']}/{m['policy']}", []).append(m)
    out = {}
    for name, runs in groups.items():
        cost, cost_se = _mean_se([r["cost_per_1k"] for r in runs])
        out[name] = {
            "feed": runs[0]["feed"],
            "policy": runs[0]["policy"],
            "seeds": [r["seed"] for r in runs],
            "cost_per_1k": cost,
            "cost_per_1k_se": cost_se,
            "classes": {c: _pooled(runs, c) for c in (*OBJECTIVE_CLASSES, "overall", "none")},
            "overall_by_seed": [r["classes"]["overall"]["attainment"] for r in runs],
            "ttft_s": {
                q: _mean_se([r["ttft_s"][q] for r in runs if r["ttft_s"][q] is not None])[0]
                for q, _ in _QS
            },
            "errors": sum(r["errors"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
            "goodput_rps": _mean_se([r["goodput_rps"] for r in runs])[0],
            "outage": _pooled(runs, "", key="outage"),
            "share": {u: _mean_se([r["share"].get(u, 0.0) for r in runs])[0] for u in ORDER},
        }
    return out


def verdicts(agg: dict[str, dict[str, Any]], metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """slo (and slo_hedged) vs priority per feed: holds when it saves >= 40% and its
    overall attainment is at least priority's minus one SE of the difference (paired by
    request, clustered in blocks of trace time: ``bench.routing_e2e.paired``)."""
    out = []
    for feed, name in itertools.product(
        sorted({a["feed"] for a in agg.values()}), ("slo", "slo_hedged")
    ):
        slo, pri = agg.get(f"{feed}/{name}"), agg.get(f"{feed}/priority")
        if slo is None or pri is None or not pri["cost_per_1k"]:
            continue
        saving = 1 - slo["cost_per_1k"] / pri["cost_per_1k"]
        diff, se, clusters = clustered_difference(
            _objective_met(metrics, feed, name, slo["seeds"]),
            _objective_met(metrics, feed, "priority", slo["seeds"]),
        )
        holds = saving >= TARGET_SAVING and se is not None and diff >= -se
        out.append(
            {
                "feed": feed,
                "policy": name,
                "saving": saving,
                "attainment_diff": diff,
                "se": se,
                "clusters": clusters,
                "holds": holds,
            }
        )
    return out


def _objective_met(
    metrics: list[dict[str, Any]], feed: str, policy: str, seeds: list[int]
) -> list[list[tuple[int, bool]]]:
    """Per seed (in ``seeds``' order), the ``objective_met`` list of that policy's run."""
    runs = {m["seed"]: m for m in metrics if m["feed"] == feed and m["policy"] == policy}
    return [[(int(b), bool(met)) for b, met in runs[seed]["objective_met"]] for seed in seeds]


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _att_cell(block: dict[str, Any]) -> str:
    se = block["se_seeds"] if block["se_seeds"] is not None else block["se_binom"]
    if block["mean"] is None:
        return "-"
    return f"{block['mean'] * 100:.1f}±{_f(None if se is None else se * 100, '.1f')}"


def table(agg: dict[str, dict[str, Any]]) -> str:
    """The printed table: one row per (feed, policy)."""
    head = (
        f"{'feed/policy':<22}{'$/1k':>8}{'800ms':>11}{'3s':>11}{'rag-3s':>11}{'overall':>11}"
        f"{'none<5s':>11}{'p50':>7}{'p90':>7}{'p99':>7}{'err':>5}{'good/s':>7}{'outage':>11}"
        "  share P/M/B/L"
    )
    rows = [head, "-" * len(head)]
    for name, a in sorted(agg.items()):
        c, t = a["classes"], a["ttft_s"]
        share = "/".join(f"{(a['share'][u] or 0) * 100:.0f}" for u in ORDER)
        rows.append(
            f"{name:<22}{_f(a['cost_per_1k'], '.3f'):>8}"
            + "".join(f"{_att_cell(c[k]):>11}" for k in (*OBJECTIVE_CLASSES, "overall", "none"))
            + "".join(f"{_f(t[q], '.2f'):>7}" for q in ("p50", "p90", "p99"))
            + f"{a['errors']:>5}{_f(a['goodput_rps'], '.2f'):>7}{_att_cell(a['outage']):>11}  {share}"
        )
    return "\n".join(rows)


def verdict_lines(items: list[dict[str, Any]]) -> str:
    lines = []
    for v in items:
        lines.append(
            f"verdict [{v['feed']}] {v['policy']} vs priority: saving {v['saving'] * 100:.1f}% "
            f"(target >= {TARGET_SAVING * 100:.0f}%), attainment diff {v['attainment_diff'] * 100:+.1f} pts "
            f"vs SE {_f(None if v['se'] is None else v['se'] * 100, '.2f')} pts "
            f"(paired by request, {v['clusters']} clusters of {BLOCK_S:g} s): "
            + ("HOLDS" if v["holds"] else "DOES NOT HOLD")
        )
    return "\n".join(lines)
