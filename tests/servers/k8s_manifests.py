"""deploy/k8s as data: every kustomization rendered by ``kubectl kustomize`` (cached per
folder), and the lookups the manifest tests share (objects by kind and name, pod specs,
containers, the gateway policy inside the rendered ConfigMap, flag values in a container's
arguments)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SECRET_EXAMPLE = K8S / "secret.example.yaml"
# Every folder with a kustomization.yaml: the base and each overlay, as paths under K8S.
KUSTOMIZATIONS = sorted(str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml"))
NAMESPACE = "switchyard"
CONFIG_MAP = "switchyard-config"
CONFIG_KEY = "config.yaml"
POD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})
KUBECTL = shutil.which("kubectl")

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl not on PATH (scripts/setup_servers.sh installs Debian's kubernetes-client; "
    "`make test-servers` runs it)",
)


def _postgres_ledger_supported() -> bool:
    try:
        parse_config("ledger: {backend: postgres, dsn_env: SWITCHYARD_LEDGER_DSN}")
    except ConfigError:
        return False
    return True


# The fleet's policies use the Postgres ledger (issue 13), which lands beside these files.
needs_postgres_ledger = pytest.mark.skipif(
    not _postgres_ledger_supported(), reason="ledger.backend postgres is not in core/config yet"
)

Obj = dict[str, Any]


@functools.cache
def _render_text(folder: str) -> str:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {folder} failed:\n{done.stderr}")
    return done.stdout


def render(folder: str) -> list[Obj]:
    """The objects ``kubectl kustomize deploy/k8s/<folder>`` prints (a fresh copy each call)."""
    return [doc for doc in yaml.safe_load_all(_render_text(folder)) if doc]


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in POD_KINDS]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def container(workload: Obj, name: str) -> Obj:
    matches = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(matches) == 1, f"{workload['metadata']['name']}: container {name!r}"
    return matches[0]


def flag(arguments: list[str], name: str) -> str:
    """The value after ``name`` in a container's ``args``."""
    assert arguments.count(name) == 1, f"{name} not given exactly once in {arguments}"
    return arguments[arguments.index(name) + 1]


def gateway(objects: list[Obj]) -> Obj:
    return find(objects, "Deployment", "switchyard-gateway")


def policy_text(objects: list[Obj]) -> str:
    text: str = find(objects, "ConfigMap", CONFIG_MAP)["data"][CONFIG_KEY]
    return text


def policy(objects: list[Obj]) -> Obj:
    """The gateway's policy file from the rendered ConfigMap, as plain YAML data."""
    data: Obj = yaml.safe_load(policy_text(objects))
    return data


def env_names(spec: Obj) -> dict[str, Obj]:
    """A container's ``env`` by variable name."""
    return {entry["name"]: entry for entry in spec.get("env", [])}


def quantity(value: Any) -> int:
    """An extended resource's count (``1`` or ``"1"``)."""
    return int(value)
