"""Provider adapters: one package per vendor wire format (``wire``, pure ``convert``, I/O in
``adapter``). OpenAI-compatible APIs are configuration of the ``openai`` kind, not code."""
