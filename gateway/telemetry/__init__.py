"""What requests did, as records, metrics and traces (see docs/architecture.md)."""
