"""The ``workers:`` section: what a valid entry looks like and every error's key path."""

from __future__ import annotations

import pytest

from core.config import ConfigError, parse_config
from core.config_workers import WorkerConfig

PROVIDERS = """
providers:
  pool: {type: vllm}
  oa: {type: openai}
  found: {type: vllm, base_url: "http://w.svc:8000/v1", discovery: {}}
"""


def errors(workers: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(PROVIDERS + "workers:\n" + workers)
    return caught.value.errors


def test_a_valid_section_is_decoded_with_defaults() -> None:
    config = parse_config(
        PROVIDERS
        + """
workers:
  gpu:
    engine: vllm
    model: meta-llama/Llama-3.1-8B-Instruct
    provider: pool
    replicas: 2
    devices: ["0", "1"]
    port_range: [8100, 8102]
"""
    )
    worker = config.workers["gpu"]
    assert worker.replicas == 2
    assert worker.device_group(1) == ["1"]
    assert worker.replace_order == "start_first"
    assert (worker.backoff.initial_s, worker.backoff.max_s) == (1.0, 60.0)
    assert list(worker.ports) == [8100, 8101, 8102]


def test_no_section_means_no_workers() -> None:
    assert parse_config(PROVIDERS).workers == {}


def test_the_port_range_needs_a_spare_port_for_start_first_replacement() -> None:
    found = errors(
        "  w: {engine: command, command: [x, '{port}'], provider: pool, "
        "replicas: 2, port_range: [9000, 9001]}\n"
    )
    assert found == [
        "workers.w: port_range [9000, 9001] holds 2 ports; 3 needed"
        " (one spare for replace: start_first)"
    ]
    stop_first = "replace: stop_first, replicas: 2, port_range: [9000, 9001]"
    config = parse_config(
        PROVIDERS + f"workers:\n  w: {{engine: command, command: [x, '{{port}}'], "
        f"provider: pool, {stop_first}}}\n"
    )
    assert config.workers["w"].replace_order == "stop_first"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("engine: vllm, provider: pool", "engine vllm needs `model`"),
        ("engine: command, provider: pool", "engine command needs `command`"),
        ("engine: command, command: [x, y], provider: pool", "must contain {port}"),
        ("engine: jax, command: [x, '{port}'], provider: pool", "for engine command only"),
        (
            "engine: jax, tensor_parallel: 2, provider: pool, devices: ['0']",
            "devices[0] has 1 devices for tensor_parallel 2",
        ),
        ("engine: jax, provider: pool, replicas: 2, devices: ['0']", "1 groups for 2 replicas"),
        (
            "engine: vllm, model: m, provider: pool, tensor_parallel: 2, devices: ['0']",
            "devices[0] has 1 devices for tensor_parallel 2",
        ),
        ("engine: jax, provider: pool, devices: ['0,0']", "names a device twice"),
        ("engine: jax, provider: pool, port_range: [9005, 9000]", "below the first"),
        (
            "engine: jax, provider: pool, accelerator: tpu, replace: start_first",
            "replace must be stop_first",
        ),
        (
            "engine: jax, provider: pool, accelerator: tpu, devices: ['0'], "
            "port_range: [60000, 60010]",
            "libtpu's mesh controller",
        ),
        ("engine: jax, provider: pool, env: {'1BAD': x}", "not an environment variable"),
        ("engine: jax, provider: pool, backoff: {initial_s: 5, max_s: 1}", "below initial_s"),
    ],
)
def test_an_invalid_entry_is_reported_at_its_key(entry: str, message: str) -> None:
    found = errors(f"  w: {{{entry}}}\n")
    assert len(found) == 1, found
    assert found[0].startswith("workers.w")
    assert message in found[0]


def test_an_unknown_field_is_reported_with_its_path() -> None:
    assert errors("  w: {engine: jax, provider: pool, replica: 2}\n") == [
        "workers.w: Object contains unknown field `replica`"
    ]


def test_the_provider_must_exist_be_vllm_and_not_discovered() -> None:
    found = errors(
        "  a: {engine: jax, provider: nope, port_range: [9000, 9001]}\n"
        "  b: {engine: jax, provider: oa, port_range: [9002, 9003]}\n"
        "  c: {engine: jax, provider: found, port_range: [9004, 9005]}\n"
    )
    assert found[0] == "workers.a.provider: unknown provider 'nope'"
    assert found[1].startswith("workers.b.provider: provider 'oa' is type openai")
    assert found[2].startswith("workers.c.provider: provider 'found' finds its replicas by DNS")
    assert len(found) == 3


def test_entries_may_not_share_ports_but_may_share_a_provider() -> None:
    found = errors(
        "  a: {engine: jax, provider: pool, port_range: [9000, 9010]}\n"
        "  b: {engine: jax, provider: pool, port_range: [9010, 9020]}\n"
    )
    assert found == [
        "workers.b.port_range: overlaps workers.a.port_range (each entry needs its own ports)"
    ]


def test_device_groups_are_split_and_trimmed() -> None:
    worker = WorkerConfig(
        engine="vllm",
        model="m",
        provider="p",
        replicas=2,
        tensor_parallel=2,
        devices=["0, 1", "2,3"],
    )
    assert worker.device_group(0) == ["0", "1"]
    assert worker.device_group(1) == ["2", "3"]
    assert WorkerConfig(engine="jax", provider="p").device_group(0) == []
