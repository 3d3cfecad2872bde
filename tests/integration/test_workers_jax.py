"""``workers:`` with ``engine: jax``: ``switchyard serve`` starts the JAX worker on the real
bundled SmolLM2 model, serves it as a replica of its provider once ``/health`` is 200, and
answers a chat through it; SIGTERM stops the worker's whole process group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.processes import GatewayProcess
from tests.integration.workers_helpers import free_range, group_gone, wait_for

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]
ADMIN = "sy-admin-workers-jax-0123456789abcdef"
MODEL = "smollm2-worker"


def test_a_jax_worker_serves_a_chat_through_the_gateway(tmp_path: Path) -> None:
    first, last = free_range(2)
    config = tmp_path / "gateway.yaml"
    config.write_text(f"""
server: {{watch_config: false}}
auth: {{admin_key_env: W_ADMIN}}
ledger: {{path: {tmp_path / "usage.sqlite3"}, spool_path: {tmp_path / "spool.sqlite3"}}}
providers:
  local: {{type: vllm, timeout_s: 600, first_token_timeout_s: 300}}
models:
  smollm2: {{targets: [{{provider: local, model: {MODEL}}}]}}
workers:
  smol:
    engine: jax
    provider: local
    served_model_name: {MODEL}
    port_range: [{first}, {last}]
    args: ["--max-model-len", "1024", "--max-batch-size", "4", "--kv-cache-tokens", "8192"]
    log_dir: {tmp_path / "logs"}
    start_timeout_s: 600
""")
    headers = {"authorization": f"Bearer {ADMIN}"}

    def worker() -> dict[str, Any]:
        rows = httpx.get(f"{gw.url}/admin/targets", headers=headers, timeout=10).json()["workers"]
        assert len(rows) == 1
        row: dict[str, Any] = rows[0]
        return row

    with GatewayProcess(config, {"W_ADMIN": ADMIN}, tmp_path / "gateway.log") as gw:
        wait_for(lambda: worker()["state"] == "ready", limit_s=600, what="the JAX worker")
        row = worker()
        assert row["engine"] == "jax" and row["targets"] == [f"local@{row['address']}/{MODEL}"]
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 16,
        }
        answer = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-switchyard-provider"] == "local"
        assert answer.json()["choices"][0]["message"]["content"]
        assert answer.json()["usage"]["completion_tokens"] > 0
        assert gw.terminate(timeout_s=120) == 0
    assert group_gone(row["pid"])
    assert (tmp_path / "logs" / "smol-0.log").stat().st_size > 0
