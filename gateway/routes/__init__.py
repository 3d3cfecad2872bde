"""One thin handler module per endpoint group; the pipeline lives in ``gateway.request``."""
