"""Trace-driven routing simulator: the real planner and strategies against simulated
targets (latency, price, capacity and outage models). See ``__main__`` for the command."""
