"""The Docker image and the replicated deployment (deploy/compose.yaml, deploy/nginx.conf), checked as far as a
machine without a Docker engine can: hadolint lints the Dockerfile; the image's command runs as a real process
with the image's environment (a temporary folder standing for /data) and keeps its data across a restart;
the compose file parses as the Compose specification (compose-spec) and wires the replicas to one Postgres,
one Redis and one results volume; and nginx (Debian's) accepts nginx.conf."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from bench.server import ROOT, free_port
from tests.serve import require_tools, wait_until
from tts_core.config import Settings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

DEPLOY = ROOT / "deploy"
REPLICAS = ("chorus-1", "chorus-2")
PIP_TOOLS = "pip install -r requirements-dev.txt"


def dockerfile():
    from dockerfile_parse import DockerfileParser

    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def instruction(parsed, name: str) -> str:
    """The value of the Dockerfile's last `name` instruction (the one in force)."""
    return [each["value"] for each in parsed.structure if each["instruction"] == name][-1]


def test_hadolint_finds_nothing_in_the_dockerfile():
    require_tools("hadolint", install=PIP_TOOLS)
    lint = subprocess.run(["hadolint", "--no-color", "--failure-threshold", "info", "Dockerfile"], cwd=ROOT,
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_image_keeps_its_data_under_a_volume_as_a_user_and_builds_cpu_or_cuda():
    parsed = dockerfile()
    assert parsed.envs["TTS_DATA_DIR"] == "/data"
    assert "/data" in instruction(parsed, "VOLUME")
    assert instruction(parsed, "USER") not in ("root", "0")
    assert set(instruction(parsed, "EXPOSE").split()) == {parsed.envs["TTS_PORT"], parsed.envs["TTS_WYOMING_PORT"]}
    assert parsed.envs["TTS_WYOMING_PORT"] == "10200"  # Wyoming's text-to-speech port (its Piper's)
    assert "TTS_ADMIN_TOKEN" not in parsed.envs  # no token baked into the image: it comes from `docker run -e`
    assert parsed.args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    runs = " ".join(each["value"] for each in parsed.structure if each["instruction"] == "RUN")
    assert re.search(r'pip install --index-url "\$TORCH_INDEX" torch==', runs)
    assert "PiperEngine(bundled_voice_path())" in runs  # its int8 graph made at build, not at every start
    assert not not_settings(parsed.envs)


def not_settings(names) -> list[str]:
    """The TTS_ variables among names that name no setting (a misspelt one is ignored without a word)."""
    return [name for name in names if name.startswith("TTS_") and name[4:].lower() not in Settings.model_fields]


def image_process(data_dir: Path, port: int, wyoming_port: int, admin_token: str):
    """The image's command, with the image's environment, run from the repository's root (the image's WORKDIR
    holds a copy of it). What a container cannot show here is changed, and only that: /data is data_dir, the
    ports are free ones, it listens on 127.0.0.1 only, `python` is this interpreter (the image's has the
    requirements installed, as this one has), and the admin token is passed as `docker run -e` would."""
    parsed = dockerfile()
    command = json.loads(instruction(parsed, "CMD"))
    assert command[0] == "python" and "ENTRYPOINT" not in {each["instruction"] for each in parsed.structure}
    env = {name: value for name, value in os.environ.items() if not name.startswith("TTS_")}
    env.update(parsed.envs)
    env.update(TTS_DATA_DIR=str(data_dir), TTS_PORT=str(port), TTS_WYOMING_PORT=str(wyoming_port),
               TTS_HOST="127.0.0.1", TTS_ADMIN_TOKEN=admin_token)
    log = (data_dir.parent / "image.log").open("ab")
    process = subprocess.Popen([sys.executable, *command[1:]], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    return process, env


def healthcheck_command() -> list[str]:
    value = instruction(dockerfile(), "HEALTHCHECK")
    command = json.loads(value[value.index("CMD") + len("CMD"):])
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def comes_up(process: subprocess.Popen, url: str) -> bool:
    """Whether url answers 200 within 3 minutes, the process still running."""
    return wait_until(lambda: answers(url) or process.poll() is not None, timeout_s=180) and process.poll() is None


def wyoming_describe(port: int) -> dict:
    """Wyoming's first exchange, as Home Assistant opens it: describe, answered by info."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b'{"type": "describe"}\n')
        return json.loads(connection.makefile("rb").readline())


def test_an_empty_wyoming_port_turns_the_images_wyoming_off(monkeypatch):
    monkeypatch.setenv("TTS_WYOMING_PORT", "")  # `docker run -e TTS_WYOMING_PORT= chorus`
    assert Settings().wyoming_port is None
    monkeypatch.setenv("TTS_WYOMING_PORT", "10200")
    assert Settings().wyoming_port == 10200


def test_the_image_command_serves_and_keeps_its_data_across_a_restart(tmp_path):
    """As `docker run -e TTS_ADMIN_TOKEN -v chorus-data:/data chorus`, then `docker restart`: /ready (what the
    image's HEALTHCHECK asks: the models calibrated) and the HEALTHCHECK answer, Wyoming answers on its port, the
    admin token from the environment opens the admin API, the database is a file under the data folder, and a key
    made before the restart is still there."""
    data_dir, port, wyoming_port, token = tmp_path / "data", free_port(), free_port(), "a-token-from-the-environment"
    admin = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{port}"
    for run in ("first", "after the restart"):
        process, env = image_process(data_dir, port, wyoming_port, token)
        try:
            assert comes_up(process, base + "/ready"), (tmp_path / "image.log").read_text()
            assert subprocess.run(healthcheck_command(), env=env, timeout=30).returncode == 0
            assert wyoming_describe(wyoming_port)["type"] == "info"
            if run == "first":
                made = httpx.post(base + "/admin/api/keys", json={"name": "kept", "tier": "free"}, headers=admin)
                assert made.status_code == 201, made.text
            keys = httpx.get(base + "/admin/api/keys", headers=admin)
            assert keys.status_code == 200 and [key["name"] for key in keys.json()["data"]] == ["kept"], run
        finally:
            process.send_signal(signal.SIGTERM)  # as `docker stop`
            stopped = process.wait(10)
        # stopped within the time `docker stop` gives (uvicorn ends by raising again the signal it handled)
        assert stopped in (0, -signal.SIGTERM), run
        assert (data_dir / "chorus.db").is_file(), run


def interpolated(value, environment: dict[str, str]):
    """Compose's `${NAME:-default}`, `${NAME:?message}` and `${NAME}`, with this environment."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\$\{(\w+)(?::[-?]([^}]*))?\}",
                  lambda found: environment.get(found.group(1)) or found.group(2) or "", value)


@pytest.fixture(scope="module")
def compose() -> dict:
    """deploy/compose.yaml, its anchors and merges resolved as Compose resolves them, parsed by compose-spec
    (the Compose specification's parser: unknown keys, wrong types and unknown values are errors) and checked
    against the specification's schema; returned as Compose reads it."""
    from compose_spec import PyCompose

    loaded = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    parsed = PyCompose.from_json(json.dumps(loaded))
    parsed.validate()
    parsed.to_spec()
    return parsed.to_dict()


def test_the_compose_file_is_valid_and_wires_every_replica_to_the_shared_state(compose):
    services, volumes = compose["services"], set(compose["volumes"])
    for name, service in services.items():  # every named volume and network a service uses is declared
        assert {mount.split(":")[0] for mount in service.get("volumes", []) if not mount.startswith(".")} <= volumes
        assert set(service.get("networks", [])) <= set(compose["networks"]), name
    assert (DEPLOY / compose["services"]["chorus-1"]["build"]["context"] / "Dockerfile").is_file()

    environments = {name: {key: interpolated(value, {}) for key, value in services[name]["environment"].items()}
                    for name in REPLICAS}
    assert len({env["TTS_REPLICA_ID"] for env in environments.values()}) == len(REPLICAS)
    nginx_address = services["nginx"]["networks"]["chorus"]["ipv4_address"]
    for name, env in environments.items():
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "TTS_ADMIN_TOKEN" in env and env["TTS_ADMIN_TOKEN"] is None  # passed through from the environment
        assert not not_settings(env)
        settings = Settings(**{key[4:].lower(): value for key, value in env.items() if value is not None})
        assert settings.database.startswith("postgresql+psycopg://") and "@postgres:" in settings.database
        assert settings.ratelimit_storage.startswith("redis://redis:")
        assert settings.trusted_proxies == [nginx_address]
        mounts = dict(mount.split(":")[:2][::-1] for mount in services[name]["volumes"])
        assert mounts[str(settings.results_path)] == "results"  # one results volume, the same on every replica
        assert mounts["/data"] == f"{name}-data"  # the image's data folder, each replica's own
    for _, service in services.items():
        assert "TTS_ADMIN_TOKEN" not in json.dumps(service.get("build", {}))


def test_nginx_accepts_its_configuration_and_sends_to_every_replica(compose, tmp_path):
    """`nginx -t` with Debian's nginx on deploy/nginx.conf, the replicas' names resolving as in compose's network
    (an /etc/hosts of its own, in a mount namespace); its upstreams are the compose file's replicas."""
    require_tools("nginx", "unshare", install="apt-get install nginx libnginx-mod-stream util-linux")
    config = (DEPLOY / "nginx.conf").read_text()
    wyoming_port = dockerfile().envs["TTS_WYOMING_PORT"]
    assert sorted(set(re.findall(r"server (\S+):7860", config))) == list(REPLICAS)
    assert sorted(set(re.findall(rf"server (\S+):{wyoming_port}", config))) == list(REPLICAS)
    assert compose["services"]["nginx"]["volumes"] == ["./nginx.conf:/etc/nginx/nginx.conf:ro"]

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost " + " ".join(REPLICAS) + "\n")
    # Debian builds nginx's stream module (Wyoming's TCP) as a module to load; nginx's own image has it built in.
    stream_module = Path("/usr/lib/nginx/modules/ngx_stream_module.so")
    globals_ = f"pid {tmp_path}/nginx.pid; error_log stderr;" + (
        f" load_module {stream_module};" if stream_module.exists() else "")
    nginx = f'mount --bind {hosts} /etc/hosts && exec nginx -t -p {tmp_path} -c {DEPLOY / "nginx.conf"} -g "{globals_}"'
    check = subprocess.run(["unshare", "--mount", *([] if os.geteuid() == 0 else ["-r"]), "sh", "-c", nginx],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "test is successful" in check.stderr

