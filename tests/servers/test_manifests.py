"""deploy/k8s rendered by the real ``kubectl kustomize`` (Debian's kubectl 1.20 has kustomize
v2.0.3; newer ones v5: the manifests are written for both), every object validated against
the Kubernetes 1.30 schemas (kubernetes-validate, strict: unknown fields are errors), and
what the manifests promise checked against the code they run: probe paths are routes the
gateway and the worker serve, container flags parse with their real CLIs, the grace period
outlasts the drain the gateway's own server settings give, GPUs and TPUs are asked for as
Kubernetes' device scheduling wants, workers are reachable under the names the policy uses,
and every secret the policy names is handed to the gateway."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import pytest
import yaml

from core.config import Config, ServerConfig, parse_config
from gateway.app import create_app
from gateway.cli.main import build_parser as gateway_parser
from gateway.process.server import uvicorn_config
from local_tier.worker.app import create_app as create_worker_app
from local_tier.worker.cli import build_parser as worker_parser
from local_tier.worker.cli import config_from_args
from local_tier.worker.state import WorkerState
from tests.fixtures.server import ServerThread
from tests.integration.gateway_harness import with_private_ledger
from tests.servers.k8s_manifests import (
    CONFIG_KEY,
    CONFIG_MAP,
    KUSTOMIZATIONS,
    NAMESPACE,
    SECRET_EXAMPLE,
    Obj,
    container,
    env_names,
    find,
    flag,
    gateway,
    needs_kubectl,
    needs_postgres_ledger,
    of_kind,
    pod_labels,
    pod_spec,
    policy,
    policy_text,
    quantity,
    render,
    workloads,
)

pytestmark = [pytest.mark.servers, needs_kubectl]

KUBERNETES_VERSION = "1.30"
OUR_IMAGES = re.compile(r"^(?:.*/)?switchyard(?:-[a-z]+)?:")
DEVICES = ("nvidia.com/gpu", "google.com/tpu")
REQUIRED_SECRETS = {"SWITCHYARD_ADMIN_KEY", "SWITCHYARD_LEDGER_DSN", "SWITCHYARD_CONTROL_DSN"}
each_kustomization = pytest.mark.parametrize("folder", KUSTOMIZATIONS)


def env_references(node: Any) -> set[str]:
    """Every environment variable a policy names (``api_key_env``, ``dsn_env``, ...)."""
    if isinstance(node, dict):
        named = {v for k, v in node.items() if k.endswith("_env") and isinstance(v, str)}
        return named.union(*(env_references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(env_references(v) for v in node))
    return set()


def gateway_container(objects: list[Obj]) -> Obj:
    return container(gateway(objects), "gateway")


# ----------------------------------------------------------------------- render, validate
def test_the_base_and_every_overlay_are_found():
    assert "base" in KUSTOMIZATIONS
    assert {
        "overlays/dev",
        "overlays/gpu-vllm",
        "overlays/gpu-vllm-tp2",
        "overlays/tpu-jax",
    } <= set(KUSTOMIZATIONS)


@each_kustomization
def test_it_renders_into_one_namespace(folder):
    objects = render(folder)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert {"HorizontalPodAutoscaler", "ServiceAccount", "StatefulSet"} <= kinds
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {NAMESPACE}
    assert find(objects, "Namespace", NAMESPACE)


@each_kustomization
def test_every_object_validates_against_the_kubernetes_schemas(folder):
    for obj in render(folder):
        where = f"{folder}: {obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


def test_the_validator_rejects_what_kubernetes_would():
    """The strict schemas do catch a misspelt field and a wrong type (so a pass means
    something)."""
    deployment = gateway(render("base"))
    probe = gateway_container([deployment])["readinessProbe"]
    probe["httpGet"]["paht"] = probe["httpGet"].pop("path")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    deployment = gateway(render("base"))
    pod_spec(deployment)["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_secret_example_validates_and_holds_no_value():
    secret = yaml.safe_load(SECRET_EXAMPLE.read_text())
    kubernetes_validate.validate(secret, KUBERNETES_VERSION, strict=True)
    assert secret["metadata"] == {"name": "switchyard-secrets", "namespace": NAMESPACE}
    assert all("<" in value for value in secret["stringData"].values())  # placeholders only


@each_kustomization
def test_no_secret_is_rendered(folder):
    assert of_kind(render(folder), "Secret") == []


# ------------------------------------------------------------------------------- the gateway
@pytest.fixture(scope="module")
def running_gateway() -> Iterator[str]:
    """A real gateway over loopback HTTP (no providers: ready at once)."""
    server = ServerThread(create_app(with_private_ledger(Config()))).start()
    try:
        yield server.url
    finally:
        server.stop()


@each_kustomization
def test_probe_paths_are_routes_the_gateway_answers(folder, running_gateway):
    spec = gateway_container(render(folder))
    readiness, liveness = spec["readinessProbe"]["httpGet"], spec["livenessProbe"]["httpGet"]
    assert (readiness["path"], liveness["path"]) == ("/readyz", "/healthz")
    assert readiness["port"] == liveness["port"] == "http"
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    args = gateway_parser().parse_args(spec["args"])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", ports["http"])
    for path in (readiness["path"], liveness["path"]):
        answer = httpx.get(running_gateway + path, timeout=10)
        assert answer.status_code == 200, (path, answer.text)


@each_kustomization
def test_the_config_flag_is_the_mounted_configmap_key(folder):
    objects = render(folder)
    deployment = gateway(objects)
    spec = gateway_container(objects)
    config_path = gateway_parser().parse_args(spec["args"]).config
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mount = next(m for m in spec["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    assert mount.get("readOnly") is True
    source = volumes[mount["name"]]["configMap"]
    assert source["name"] == CONFIG_MAP
    assert config_path == f"{mount['mountPath']}/{CONFIG_KEY}"
    assert "items" not in source  # every key, under its own name
    assert CONFIG_KEY in find(objects, "ConfigMap", CONFIG_MAP)["data"]


@each_kustomization
def test_the_configmap_name_is_stable_so_updates_hot_reload(folder):
    """No hash suffix: an update changes the mounted file in place (the gateway reloads it)
    instead of rolling the pods (tests/integration/test_reload_configmap.py)."""
    names = [o["metadata"]["name"] for o in of_kind(render(folder), "ConfigMap")]
    assert names == [CONFIG_MAP]
    assert policy(render(folder))["server"]["watch_config"] is True


@each_kustomization
def test_the_grace_period_outlasts_the_drain(folder):
    """After preStop, SIGTERM: uvicorn waits up to ``timeout_graceful_shutdown`` for open
    connections, then the lifespan waits up to ``drain_timeout_s`` for requests."""
    objects = render(folder)
    spec = gateway_container(objects)
    sleep = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    assert int(sleep[1]) >= 5, "the endpoints controller and kube-proxy need a few seconds"
    server = ServerConfig(**policy(objects).get("server", {}))
    connections = uvicorn_config(None, server, "0.0.0.0", 8080).timeout_graceful_shutdown
    assert connections is not None
    worst = int(sleep[1]) + connections + server.drain_timeout_s
    grace = pod_spec(gateway(objects))["terminationGracePeriodSeconds"]
    assert grace > worst, f"grace {grace} s <= preStop + connections + drain = {worst} s"


@each_kustomization
def test_secrets_the_policy_names_reach_the_gateway(folder):
    objects = render(folder)
    env = env_names(gateway_container(objects))
    example = yaml.safe_load(SECRET_EXAMPLE.read_text())["stringData"]
    named = env_references(policy(objects))
    assert named >= REQUIRED_SECRETS
    for name in named:
        assert name in env, f"{name} (named by the policy) is not set in the gateway pod"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("switchyard-secrets", name)
        assert name in example, f"{name} missing from {SECRET_EXAMPLE.name}"
        assert ref.get("optional", False) is (name not in REQUIRED_SECRETS)


@each_kustomization
def test_the_gateway_scales_and_survives_disruptions(folder):
    objects = render(folder)
    deployment = gateway(objects)
    labels = pod_labels(deployment)
    hpa = find(objects, "HorizontalPodAutoscaler", "switchyard-gateway")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "switchyard-gateway",
    }
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    assert "cpu" in gateway_container(objects)["resources"]["requests"]  # HPA needs it
    pdb = find(objects, "PodDisruptionBudget", "switchyard-gateway")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["maxUnavailable"] < hpa["minReplicas"]
    service = find(objects, "Service", "switchyard-gateway")["spec"]
    assert service["selector"].items() <= labels.items()
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    account = pod_spec(deployment)["serviceAccountName"]
    assert find(objects, "ServiceAccount", account)["automountServiceAccountToken"] is False


@each_kustomization
def test_our_containers_run_as_non_root_on_a_read_only_root(folder):
    objects = render(folder)
    ours = 0
    for workload in workloads(objects):
        pod = pod_spec(workload)
        for spec in pod["containers"]:
            if not OUR_IMAGES.match(spec["image"]):
                continue
            ours += 1
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's USER
            security = spec["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            writable = {m["mountPath"] for m in spec["volumeMounts"] if not m.get("readOnly")}
            assert "/tmp" in writable
    assert ours >= 2  # the gateway and the JAX worker


@each_kustomization
def test_files_the_gateway_writes_are_on_writable_volumes(folder):
    objects = render(folder)
    spec = gateway_container(objects)
    writable = [m["mountPath"] for m in spec["volumeMounts"] if not m.get("readOnly")]
    config = policy(objects)
    files = [config["ledger"]["spool_path"]]
    if config["batch"].get("backend", "sqlite") == "sqlite":
        files.append(config["batch"]["path"])
    for file in files:
        assert any(file.startswith(path + "/") for path in writable), file


# ------------------------------------------------------------------------------- the workers
@each_kustomization
def test_every_worker_the_policy_names_is_a_pod_of_a_headless_service(folder):
    """``http://<statefulset>-<i>.<service>:<port>/v1`` (one pod) or, with ``discovery``,
    ``http://<service>:<port>/v1`` (every ready pod): the StatefulSet has that pod (or is
    the Service's), its Service is headless and selects it, and the worker listens on that
    port."""
    objects = render(folder)
    workers = {n: p for n, p in policy(objects)["providers"].items() if p["type"] == "vllm"}
    assert workers
    for name, provider in workers.items():
        url = urlsplit(provider["base_url"])
        assert url.path == "/v1", name
        if "discovery" in provider:
            service_name = url.hostname
            statefulset = next(
                o
                for o in objects
                if o["kind"] == "StatefulSet" and o["spec"]["serviceName"] == service_name
            )
        else:
            pod, service_name = url.hostname.split(".")  # type: ignore[union-attr]
            owner, _, index = pod.rpartition("-")
            statefulset = find(objects, "StatefulSet", owner)
            assert statefulset["spec"]["serviceName"] == service_name
            assert int(index) < statefulset["spec"]["replicas"], f"{name}: no pod {pod}"
        service = find(objects, "Service", service_name)["spec"]
        assert service["clusterIP"] == "None", f"{service_name} is not headless"
        assert service["selector"].items() <= pod_labels(statefulset).items()
        (serving,) = pod_spec(statefulset)["containers"]
        ports = {p["name"]: p["containerPort"] for p in serving["ports"]}
        assert url.port == ports["http"] == int(flag(serving["args"], "--port"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert serving[probe]["httpGet"] == {"path": "/health", "port": "http"}


@each_kustomization
def test_the_jax_worker_flags_parse_and_its_probe_is_a_route(folder):
    worker = find(render(folder), "StatefulSet", "switchyard-jax-worker")
    spec = container(worker, "worker")
    assert spec["args"][:2] == ["worker", "jax"]
    args = worker_parser().parse_args(spec["args"][2:])
    config = config_from_args(args)
    assert args.host == "0.0.0.0"
    assert args.compile_cache_dir.startswith("/var/cache/switchyard/")
    assert any(m["mountPath"] == "/var/cache/switchyard" for m in spec["volumeMounts"])

    async def never_loaded(_: Any) -> Any:
        raise AssertionError("not started")

    routes = {r.path for r in create_worker_app(WorkerState(config, never_loaded)).routes}
    assert spec["readinessProbe"]["httpGet"]["path"] in routes


@each_kustomization
def test_devices_are_asked_for_in_limits_with_equal_or_no_requests(folder):
    """Kubernetes' device-plugin scheduling: extended resources go in limits; a request,
    if given, must equal the limit."""
    for workload in workloads(render(folder)):
        for spec in pod_spec(workload)["containers"]:
            resources = spec.get("resources", {})
            limits, requests = resources.get("limits", {}), resources.get("requests", {})
            for device in DEVICES:
                if device in requests:
                    assert device in limits and requests[device] == limits[device], device
                if device in limits:
                    assert quantity(limits[device]) >= 1, device


@pytest.mark.parametrize(
    ("folder", "gpus"), [("overlays/gpu-vllm", 1), ("overlays/gpu-vllm-tp2", 2)]
)
def test_vllm_uses_as_many_gpus_as_its_tensor_parallel_size(folder, gpus):
    objects = render(folder)
    vllm = container(find(objects, "StatefulSet", "switchyard-vllm"), "vllm")
    assert vllm["command"] == ["vllm", "serve"]
    assert quantity(vllm["resources"]["limits"]["nvidia.com/gpu"]) == gpus
    assert int(flag(vllm["args"], "--tensor-parallel-size")) == gpus
    shm = next(m for m in vllm["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(
        v
        for v in pod_spec(find(objects, "StatefulSet", "switchyard-vllm"))["volumes"]
        if v["name"] == shm["name"]
    )
    assert volume["emptyDir"]["medium"] == "Memory"
    served = flag(vllm["args"], "--served-model-name")
    targets = [t for m in policy(objects)["models"].values() for t in m["targets"]]
    assert {t["model"] for t in targets if t["provider"] == "vllm"} == {served}
    provider = policy(objects)["providers"]["vllm"]  # every ready pod, by DNS discovery
    assert "discovery" in provider
    service = find(objects, "Service", "switchyard-vllm")
    assert service["spec"]["clusterIP"] == "None"  # headless: one record per ready pod
    assert provider["base_url"].startswith(f"http://{service['metadata']['name']}:")


def test_no_device_outside_its_overlay():
    for folder in ("base", "overlays/dev"):
        text = yaml.safe_dump(render(folder))
        assert not any(device in text for device in DEVICES), folder


def test_the_tpu_overlay_puts_the_jax_worker_on_one_tpu_chip():
    worker = find(render("overlays/tpu-jax"), "StatefulSet", "switchyard-jax-worker")
    pod = pod_spec(worker)
    selector = pod["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-accelerator"].startswith("tpu-")
    chips = 1
    for side in selector["cloud.google.com/gke-tpu-topology"].split("x"):
        chips *= int(side)
    spec = container(worker, "worker")
    assert quantity(spec["resources"]["limits"]["google.com/tpu"]) == chips == 1  # one device
    assert flag(spec["args"], "--backend") == "tpu"
    assert spec["image"].startswith("switchyard-tpu:")
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


# ------------------------------------------------------------------------------- the policy
def test_the_dev_overlay_runs_the_redis_and_postgres_the_policy_reaches():
    objects = render("overlays/dev")
    redis = urlsplit(policy(objects)["state"]["redis"]["url"])
    service = find(objects, "Service", redis.hostname or "")["spec"]
    assert redis.port in [p["port"] for p in service["ports"]]
    postgres = find(objects, "Service", "switchyard-postgres")["spec"]
    assert [p["port"] for p in postgres["ports"]] == [5432]
    for name in ("switchyard-redis", "switchyard-postgres"):
        assert find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0][
            "readinessProbe"
        ]


def test_the_vllm_policy_is_the_base_policy_plus_the_worker():
    """overlays/gpu-vllm replaces the policy file: everything of the base stays as it is."""
    base, gpu = policy(render("base")), policy(render("overlays/gpu-vllm"))
    assert {k: v for k, v in gpu.items() if k not in ("providers", "models")} == {
        k: v for k, v in base.items() if k not in ("providers", "models")
    }
    assert base["providers"].items() <= gpu["providers"].items()
    for alias, model in base["models"].items():
        added = [t for t in gpu["models"][alias]["targets"] if t not in model["targets"]]
        assert [t for t in gpu["models"][alias]["targets"] if t not in added] == model["targets"]
    assert policy(render("overlays/gpu-vllm-tp2")) == gpu


@needs_postgres_ledger
@each_kustomization
def test_the_rendered_policy_passes_check_config(folder):
    config = parse_config(policy_text(render(folder)))
    assert (config.state.backend, config.ledger.backend) == ("redis", "postgres")
    assert config.ledger.dsn_env == "SWITCHYARD_LEDGER_DSN"
    assert config.control is not None and config.control.backend == "postgres"
    assert config.server.watch_config
