"""The Dockerfile, .dockerignore and compose.yaml, checked without a Docker engine (none runs
on CI's machines): a slim multi-stage image that runs as a non-root user, copies no secret
and nothing outside an allow-list, whose HEALTHCHECK really passes against a running gateway
(and fails against nothing), whose commands parse with the real CLI; a compose file whose
references all resolve (services, volumes, mounted files, the policy's hosts and secrets).
The wheel the image installs is built for real (``servers`` stage): it must hold every file
of the packages, data files included. (No Docker engine or compose plugin runs here: the compose file is checked by parsing it.)"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.config import Config, ServerConfig, parse_config
from gateway.app import create_app
from gateway.cli.main import build_parser as gateway_parser
from gateway.process.server import uvicorn_config
from local_tier.worker.cli import build_parser as worker_parser
from tests.fixtures.server import ServerThread, free_port
from tests.integration.gateway_harness import with_private_ledger
from tests.servers.container_files import (
    COMPOSE,
    ROOT,
    Instruction,
    compose,
    context_files,
    dockerfile,
    dockerignore,
    duration_s,
    healthcheck_command,
)
from tests.servers.k8s_manifests import needs_postgres_ledger

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|DSN|CREDENTIAL", re.IGNORECASE)
GATEWAYS = ("gateway-1", "gateway-2")
DSN_VARIABLES = ("SWITCHYARD_LEDGER_DSN", "SWITCHYARD_CONTROL_DSN")


def final_stage() -> list[Instruction]:
    instructions = dockerfile()
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def only(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"{keyword}: {len(found)} in the final stage"
    return found[0]


def build_args() -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults."""
    defaults = {}
    for instruction in dockerfile():
        if instruction.keyword == "ARG" and instruction.stage == -1:
            name, _, value = instruction.args.partition("=")
            defaults[name] = value
    return defaults


def base_image(instruction: Instruction) -> str:
    image = instruction.args.split()[0]
    for name, value in build_args().items():
        image = image.replace("${" + name + "}", value)
    return image


def copy_sources(stage: list[Instruction]) -> list[str]:
    """The build-context paths COPY takes (not those from another stage)."""
    sources = []
    for instruction in stage:
        if instruction.keyword == "COPY" and "--from=" not in instruction.args:
            sources += instruction.args.split()[:-1]
    return sources


# ---------------------------------------------------------------------------- Dockerfile
def test_the_image_is_multi_stage_on_python_slim():
    froms = [i for i in dockerfile() if i.keyword == "FROM"]
    assert len(froms) >= 2
    assert all(base_image(f).startswith("python:3.11-slim") for f in froms)
    assert froms[0].args.split()[-2:] == ["AS", "build"]
    assert any("--from=build" in i.args for i in final_stage() if i.keyword == "COPY")


def test_the_image_runs_as_the_non_root_user_it_creates():
    stage = final_stage()
    user = only(stage, "USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, "a numeric uid lets runAsNonRoot verify it"
    created = " ".join(i.args for i in stage if i.keyword == "RUN")
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    after_user = stage[stage.index(only(stage, "USER")) :]
    assert not [i for i in after_user if i.keyword == "RUN"], "nothing runs as root after USER"


def test_the_commands_parse_with_the_real_cli():
    stage = final_stage()
    assert only(stage, "ENTRYPOINT").exec_form() == ["switchyard"]
    args = gateway_parser().parse_args(only(stage, "CMD").exec_form())
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8080)
    assert args.config == "/etc/switchyard/config.yaml"
    assert only(stage, "EXPOSE").args == str(args.port)


def test_no_secret_is_copied_or_baked_in():
    for instruction in dockerfile():
        if instruction.keyword in ("ENV", "ARG"):
            names = re.findall(r"(\w+)=", instruction.args) or [instruction.args.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], instruction
    sources = copy_sources(dockerfile())
    assert "." not in sources and "./" not in sources, "COPY . would take the whole context"
    rules = dockerignore()
    for source in sources:
        assert not rules.excluded(source), f"COPY {source}: excluded by .dockerignore"


def test_the_image_copies_every_package_pyproject_declares():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    declared = {pattern.rstrip("*") for pattern in include}
    sources = set(copy_sources(dockerfile()))
    assert declared <= sources
    assert {"pyproject.toml", "README.md"} <= sources  # setuptools reads both


def test_dockerignore_keeps_the_sources_and_nothing_private():
    rules = dockerignore()
    for private in (".venv/bin/python", ".git/HEAD", ".env", "switchyard-keys.json"):
        assert rules.excluded(private), private
    for cached in ("core/__pycache__/config.cpython-311.pyc", "switchyard-usage.sqlite3"):
        assert rules.excluded(cached), cached
    for kept in ("pyproject.toml", "core/config.py", "gateway/cli/main.py"):
        assert not rules.excluded(kept), kept
    files = context_files(rules)
    top = {f.split("/")[0] for f in files}
    assert top == {"pyproject.toml", "README.md", *copy_sources(dockerfile())} - {"./"}
    assert not [f for f in files if f.endswith((".pyc", ".sqlite3"))]


@pytest.fixture(scope="module")
def running_gateway() -> Iterator[ServerThread]:
    server = ServerThread(create_app(with_private_ledger(Config()))).start()
    try:
        yield server
    finally:
        server.stop()


def run_healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command as Docker runs it, aimed at ``port`` instead of 8080."""
    options, command = healthcheck_command(only(final_stage(), "HEALTHCHECK"))
    assert command[:2] == ["python", "-c"]
    code = command[2]
    assert "127.0.0.1:8080/healthz" in code
    code = code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    timeout = duration_s(options["timeout"])
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout + 10,
    )


def test_the_healthcheck_passes_against_a_running_gateway(running_gateway):
    done = run_healthcheck(running_gateway.port)
    assert done.returncode == 0, done.stderr


def test_the_healthcheck_fails_when_nothing_answers():
    assert run_healthcheck(free_port()).returncode != 0


# ------------------------------------------------------------------------------- compose
def policy_of_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "deploy/compose/config.yaml").read_text())
    return data


def env_references(node: Any) -> set[str]:
    if isinstance(node, dict):
        named = {v for k, v in node.items() if k.endswith("_env") and isinstance(v, str)}
        return named.union(*(env_references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(env_references(v) for v in node))
    return set()


def listening_port(service: dict[str, Any]) -> int:
    """The --port of a service's switchyard command."""
    command = service["command"]
    return int(command[command.index("--port") + 1])


def test_compose_references_resolve():
    spec = compose()
    services, volumes = spec["services"], spec["volumes"]
    for name, service in services.items():
        for dependency, how in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], dependency
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} missing"
            else:
                assert source in volumes, f"{name}: volume {source} not declared"
        for published in service.get("ports", []):
            assert published.startswith("127.0.0.1:"), f"{name} publishes beyond loopback"


def test_compose_runs_two_gateways_on_one_image_and_one_jax_worker():
    services = compose()["services"]
    images = {services[name]["image"] for name in (*GATEWAYS, "jax-worker")}
    assert len(images) == 1
    for name in GATEWAYS:
        args = gateway_parser().parse_args(services[name]["command"])
        assert args.command == "serve"
        mount = next(m for m in services[name]["volumes"] if m.split(":")[1] == "/etc/switchyard")
        assert mount.endswith(":ro")
        host_folder = COMPOSE.parent / mount.split(":")[0]
        assert (host_folder / Path(args.config).name).is_file()
        assert args.config == f"/etc/switchyard/{Path(args.config).name}"
    worker = services["jax-worker"]["command"]
    assert worker[:2] == ["worker", "jax"]
    assert worker_parser().parse_args(worker[2:]).host == "0.0.0.0"
    assert {services[name]["ports"][0] for name in GATEWAYS} == {
        "127.0.0.1:8081:8080",
        "127.0.0.1:8082:8080",
    }


def test_the_compose_policy_reaches_services_that_exist():
    services = compose()["services"]
    policy = policy_of_compose()
    redis = urlsplit(policy["state"]["redis"]["url"])
    assert redis.hostname in services and redis.port == 6379
    workers = [p for p in policy["providers"].values() if p["type"] == "vllm"]
    assert workers
    for provider in workers:
        url = urlsplit(provider["base_url"])
        assert url.hostname in services
        assert url.port == listening_port(services[url.hostname])
    for name, variable in itertools.product(GATEWAYS, DSN_VARIABLES):
        dsn = urlsplit(services[name]["environment"][variable])
        assert dsn.hostname in services and dsn.port == 5432
        postgres = services[dsn.hostname]["environment"]
        assert (dsn.username, dsn.password, dsn.path) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
            "/" + postgres["POSTGRES_DB"],
        )


def test_every_secret_the_compose_policy_names_is_set():
    names = env_references(policy_of_compose())
    assert {"SWITCHYARD_ADMIN_KEY", "SWITCHYARD_LEDGER_DSN", "SWITCHYARD_CONTROL_DSN"} <= names
    for gateway in GATEWAYS:
        environment = compose()["services"][gateway]["environment"]
        assert names <= environment.keys()
    admin = compose()["services"]["gateway-1"]["environment"]["SWITCHYARD_ADMIN_KEY"]
    assert admin.startswith("${SWITCHYARD_ADMIN_KEY:?"), "no default admin key"


def test_compose_waits_for_the_drain_on_stop():
    policy = policy_of_compose()
    server = ServerConfig(**policy.get("server", {}))
    connections = uvicorn_config(None, server, "0.0.0.0", 8080).timeout_graceful_shutdown
    assert connections is not None
    for name in GATEWAYS:
        grace = duration_s(compose()["services"][name]["stop_grace_period"])
        assert grace > connections + server.drain_timeout_s


def test_the_batch_store_is_on_the_volume_the_gateways_share():
    path = policy_of_compose()["batch"]["path"]
    mounts = [
        {m.split(":")[1]: m.split(":")[0] for m in compose()["services"][name]["volumes"]}
        for name in GATEWAYS
    ]
    folder = str(Path(path).parent)
    assert mounts[0][folder] == mounts[1][folder] == "batches"


@needs_postgres_ledger
def test_the_compose_policy_passes_check_config():
    config = parse_config((ROOT / "deploy/compose/config.yaml").read_text())
    assert (config.state.backend, config.ledger.backend) == ("redis", "postgres")
    assert config.ledger.dsn_env == "SWITCHYARD_LEDGER_DSN"
    assert config.control is not None and config.control.dsn_env == "SWITCHYARD_CONTROL_DSN"


# ------------------------------------------------------------------- the wheel it installs
@pytest.mark.servers
def test_the_wheel_the_image_installs_holds_every_package_file(tmp_path):
    """What ``pip install .`` in the build stage gets: the build context (COPY sources,
    .dockerignore applied) built into a wheel as pip builds it there (in an isolated
    environment with the setuptools that pyproject.toml asks for, from the package index)."""
    context = tmp_path / "context"
    for relative in context_files(dockerignore()):
        target = context / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, target)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path / "dist"), str(context)],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("switchyard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = [f for f in context_files(dockerignore()) if "/" in f]
    missing = [f for f in packaged if f not in names]
    assert not missing, f"not in the wheel (so not in the image): {missing}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "switchyard = gateway.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
