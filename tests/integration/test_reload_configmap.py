"""Hot reload when the policy file is a Kubernetes ConfigMap volume.

The kubelet's atomic writer lays a ConfigMap out as ``config.yaml -> ..data/config.yaml``,
``..data -> ..<timestamp>/``, and on an update writes a new timestamped folder, points a
fresh symlink at it, renames that symlink over ``..data`` (one atomic step) and deletes the
old folder. ``ConfigMapVolume`` below does exactly that, so these tests see what a gateway
pod sees: the watcher and POST /admin/reload follow the swap, and an invalid update is
rejected while the old policy keeps serving."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from core.config import load_config
from gateway.app import create_app
from gateway.process.reload import visible_path
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread, serve
from tests.integration.gateway_harness import with_private_ledger

ADMIN = "sy-admin-test-key"
ENV = {"TEST_OA_KEY": "sk-test", "TEST_ADMIN_KEY": ADMIN}
KEY = "config.yaml"


class ConfigMapVolume:
    """A folder laid out and updated as the kubelet's atomic writer does for a ConfigMap
    mounted as a volume (no ``subPath``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._generation = itertools.count()

    @property
    def path(self) -> Path:
        """What the pod mounts and passes to ``--config``: the visible symlink."""
        return self.root / KEY

    def _data_folder(self) -> Path:
        return self.root / os.readlink(self.root / "..data")

    def publish(self, text: str) -> None:
        """Write ``text`` as a new payload and swap ``..data`` to it atomically; the old
        payload folder is deleted afterwards, as the kubelet does."""
        old = self._data_folder() if (self.root / "..data").is_symlink() else None
        stamp = f"..2024_06_01_12_00_00.{next(self._generation):09d}"
        (self.root / stamp).mkdir()
        (self.root / stamp / KEY).write_text(text)
        (self.root / "..data_tmp").symlink_to(stamp)
        os.rename(self.root / "..data_tmp", self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to(f"..data/{KEY}")
        if old is not None:
            shutil.rmtree(old)


def policy(upstream: str, aliases: list[str], *, broken: bool = False) -> str:
    models = "\n".join(
        f"  {alias}: {{targets: [{{provider: oa, model: m-ok}}]}}" for alias in aliases
    )
    extra = "routing: {max_attempts_per_target: 0}\n" if broken else ""
    return f"""
server: {{watch_config: true, watch_interval_s: 0.05}}
auth: {{admin_key_env: TEST_ADMIN_KEY}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: TEST_OA_KEY}}
models:
{models}
{extra}"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture
def volume(tmp_path: Path) -> ConfigMapVolume:
    return ConfigMapVolume(tmp_path / "etc-switchyard")


@pytest.fixture
def gateway(volume: ConfigMapVolume, upstream: FakeOpenAI) -> Iterator[ServerThread]:
    volume.root.mkdir()
    volume.publish(policy(upstream.url, ["first"]))  # type: ignore[attr-defined]
    server = ServerThread(create_app(with_private_ledger(load_config(volume.path)), env=ENV))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def model_ids(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]


def wait_for_models(url: str, wanted: list[str]) -> list[str]:
    """Poll /v1/models until it lists ``wanted`` (20 s at most); return the last listing."""
    deadline = time.monotonic() + 20
    ids = model_ids(url)
    while ids != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        ids = model_ids(url)
    return ids


def reload_count(url: str, outcome: str) -> float:
    """``switchyard_config_reloads_total{outcome=...}`` from the gateway's /metrics."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("switchyard_config_reloads_total{") and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def ask(url: str, model: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return answer.choices[0].message.content or ""


def test_the_watcher_follows_a_configmap_swap(volume, gateway, upstream):
    assert model_ids(gateway.url) == ["first"]
    volume.publish(policy(upstream.url, ["first", "added"]))
    assert wait_for_models(gateway.url, ["first", "added"]) == ["first", "added"]
    assert ask(gateway.url, "added") == "Hello from openai!"
    volume.publish(policy(upstream.url, ["third"]))  # a second swap: the first is not special
    assert wait_for_models(gateway.url, ["third"]) == ["third"]


def test_admin_reload_reads_the_swapped_configmap(volume, gateway, upstream):
    volume.publish(policy(upstream.url, ["second"]))
    answer = httpx.post(gateway.url + "/admin/reload", headers={"authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["models"] == ["second"]
    assert model_ids(gateway.url) == ["second"]


def test_an_invalid_configmap_update_is_rejected_and_the_old_policy_serves(
    volume, gateway, upstream
):
    volume.publish(policy(upstream.url, ["first", "added"], broken=True))
    deadline = time.monotonic() + 20
    while reload_count(gateway.url, "rejected") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reload_count(gateway.url, "rejected") == 1
    assert model_ids(gateway.url) == ["first"]
    assert ask(gateway.url, "first") == "Hello from openai!"
    volume.publish(policy(upstream.url, ["first", "added"]))  # the fixed update applies
    assert wait_for_models(gateway.url, ["first", "added"]) == ["first", "added"]


def test_visible_path_maps_a_payload_folder_back_to_the_volume_name(volume):
    volume.root.mkdir()
    volume.publish("models: {}\n")
    resolved = volume.path.resolve()
    assert resolved.parent.name.startswith("..2024_")
    assert visible_path(resolved) == volume.path
    nested = volume.root / "..2024_06_01_12_00_00.000000000" / "sub" / KEY
    assert visible_path(nested) == volume.root / "sub" / KEY


def test_visible_path_leaves_other_paths_alone(tmp_path):
    plain = tmp_path / KEY
    assert visible_path(plain) == plain
    dotted = tmp_path / "..not-a-volume" / KEY  # a dotted folder without a ..data sibling
    assert visible_path(dotted) == dotted
