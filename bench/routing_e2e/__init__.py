"""Trace-driven end-to-end routing benchmark: a seeded mixed workload replayed through real
gateway processes (one per routing strategy) against fake OpenAI-compatible upstreams on
loopback HTTP, with TTFT measured at the client and cost taken from what each upstream
served. Run ``python -m bench.routing_e2e --help``; see docs/bench/routing_e2e.md."""
