"""``workers:`` with ``engine: vllm`` on the real vLLM CPU build: ``switchyard serve`` starts
``vllm serve`` itself (the argv ``local_tier/workers/launch.py`` builds, run from the venv
``scripts/setup_vllm.sh`` made), serves it once ``/health`` answers, reports its queue and KV
use from its own ``/metrics``, answers a chat through it and, on SIGTERM, stops the whole
process group (vLLM's API server and engine core). Slow stage only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from local_tier.vllm.process import DEFAULT_MODEL, DEFAULT_VENV, OFFLINE_ENV, default_cpu_dtype
from tests.integration.processes import GatewayProcess
from tests.integration.workers_helpers import free_range, group_gone, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (DEFAULT_VENV / "bin" / "vllm").exists(),
        reason=".vllm-venv missing: run `bash scripts/setup_vllm.sh` (the slow CI stage does)",
    ),
]
ADMIN = "sy-admin-vllm-workers-0123456789abcdef"
MODEL = "smollm2-vllm-worker"


def policy(tmp_path: Path, ports: tuple[int, int]) -> str:
    env = {**OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(DEFAULT_VENV / "shim")}
    env_yaml = ", ".join(f"{k}: '{v}'" for k, v in env.items())
    args = [
        "--max-model-len", "2048", "--dtype", default_cpu_dtype(), "--enforce-eager",
        "--enable-prefix-caching", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    return f"""
server: {{watch_config: false}}
auth: {{admin_key_env: W_ADMIN}}
ledger: {{path: {tmp_path / "usage.sqlite3"}, spool_path: {tmp_path / "spool.sqlite3"}}}
providers:
  cpu-pool: {{type: vllm, timeout_s: 300, first_token_timeout_s: 120}}
models:
  smollm2: {{targets: [{{provider: cpu-pool, model: {MODEL}}}]}}
workers:
  smol:
    engine: vllm
    executable: {DEFAULT_VENV / "bin" / "vllm"}
    model: {DEFAULT_MODEL}
    served_model_name: {MODEL}
    provider: cpu-pool
    port_range: [{ports[0]}, {ports[1]}]
    args: [{", ".join(repr(a) for a in args)}]
    env: {{{env_yaml}}}
    log_dir: {tmp_path / "logs"}
    start_timeout_s: 600
"""


def test_serve_runs_a_real_vllm_worker_and_stops_its_group(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(policy(tmp_path, free_range(2)))
    headers = {"authorization": f"Bearer {ADMIN}"}

    def worker(gw: GatewayProcess) -> dict[str, Any]:
        report = httpx.get(f"{gw.url}/admin/targets", headers=headers, timeout=10).json()
        (row,) = report["workers"]
        found: dict[str, Any] = row
        return found

    with GatewayProcess(config, {"W_ADMIN": ADMIN}, tmp_path / "gateway.log") as gw:
        wait_for(lambda: worker(gw)["state"] == "ready", limit_s=600, what="the vLLM worker")
        client = openai.OpenAI(base_url=gw.base_url, api_key=ADMIN, max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=12,
        )
        answer = raw.parse()
        row = worker(gw)
        assert raw.headers["x-switchyard-provider"] == "cpu-pool"
        assert row["targets"] == [f"cpu-pool@{row['address']}/{MODEL}"]
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens > 0
        assert row["engine"] == "vllm" and row["restarts"] == 0
        # Its load comes from vLLM's own /metrics, read through the vLLM mapping.
        wait_for(lambda: worker(gw)["kv_usage"] is not None, limit_s=30, what="its metrics")
        assert worker(gw)["waiting"] == 0
        assert gw.terminate(timeout_s=120) == 0
    assert group_gone(row["pid"])
    assert "Application startup complete" in (tmp_path / "logs" / "smol-0.log").read_text()
