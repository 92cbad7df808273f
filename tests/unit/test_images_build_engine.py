"""images.build's own client of the engine's API on its Unix socket (gpuprov.images.engine), judged by the Docker
SDK it stands in for: the same archive byte for byte (docker.utils.tar), the same socket (docker.utils.parse_host),
the same proxy build arguments (docker.utils.proxy) and the same X-Registry-Config (APIClient's own header); and
a no-change rebuild, verification included, on this machine's engine without importing the SDK at all."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from docker.utils import parse_host
from docker.utils import tar as sdk_archive
from docker.utils.proxy import ProxyConfig
from helpers.images import context_tree

from gpuprov.core.errors import GpuprovError
from gpuprov.images.build import context_archive
from gpuprov.images.engine import _send, proxy_build_args, registry_headers, socket_path

PROJECT = Path(__file__).resolve().parents[2]
REPOSITORY = "gpuprov-test/images-build-engine"


def received(parts: list) -> bytes:
    """What `_send` puts on a socket, as its peer reads it."""
    ours, theirs = socket.socketpair()
    got = bytearray()
    reader = threading.Thread(target=lambda: [got.extend(b) for b in iter(lambda: theirs.recv(1 << 16), b"")])
    reader.start()
    try:
        _send(ours, parts)
    finally:
        ours.close()
        reader.join()
        theirs.close()
    return bytes(got)


def test_the_archive_sent_on_the_socket_is_the_sdks_own_byte_for_byte(tmp_path):
    context = context_tree(tmp_path / "ctx")
    parts, size = context_archive(context)
    expected = sdk_archive(str(context)).read()
    assert received(parts) == expected and size == len(expected)


def test_a_file_that_shrinks_before_it_is_sent_is_an_error_naming_it(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    big = context / "big.whl"
    big.write_bytes(b"w" * 20000)
    parts, _ = context_archive(context)
    big.write_bytes(b"w" * 100)
    with pytest.raises(GpuprovError) as caught:
        received(parts)
    assert caught.value.message == f"cannot send {big} to the engine: it shrank to 100 bytes while it was sent"


@pytest.mark.parametrize("host", [None, "unix:///var/run/docker.sock", "unix:///run/user/1000/docker.sock"])
def test_the_socket_is_the_one_the_sdk_connects_to(host):
    environ = {"DOCKER_HOST": host} if host else {}
    assert "http+unix://" + socket_path(environ) == parse_host(host)


@pytest.mark.parametrize("host", ["tcp://127.0.0.1:2375", "ssh://builder@10.0.0.5", "tcp://127.0.0.1:2376"])
def test_an_engine_elsewhere_is_left_to_the_sdk(host):
    assert socket_path({"DOCKER_HOST": host}) is None


@pytest.mark.parametrize("proxies", [
    {},
    {"httpProxy": "http://proxy:3128"},
    {"httpProxy": "http://proxy:3128", "httpsProxy": "http://proxy:3129", "ftpProxy": "ftp://p:21",
     "noProxy": "localhost,127.0.0.1"},
])
def test_the_proxies_of_the_config_file_are_the_build_arguments_the_sdk_gives(proxies):
    config = {"proxies": {"default": proxies}}
    assert proxy_build_args(config) == ProxyConfig.from_dict(proxies).get_environment()


def test_registry_credentials_go_as_the_sdks_build_sends_them(tmp_path, monkeypatch):
    import docker

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert registry_headers() == {}          # no config file: no header
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"default": {"httpProxy": "http://p:3128"}}}))
    assert registry_headers() == {}          # no credentials in it: none either
    (tmp_path / "config.json").write_text(json.dumps({"auths": {
        "registry.example:5000": {"auth": "Y2k6czNjcmV0"}, "https://index.docker.io/v1/": {"auth": "dTpw"}}}))
    sdk_headers: dict = {}
    docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")._set_auth_headers(sdk_headers)
    assert sdk_headers and registry_headers() == {key: value.decode() for key, value in sdk_headers.items()}


NO_SDK = """
import json, sys
from pathlib import Path
from gpuprov.images.build import build_engine, build_image
from gpuprov.images.verify import verify_image
engine = build_engine()
context, tag, record = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
first = build_image(engine.api, "tiny", context, [tag])
again = build_image(engine.api, "tiny", context, [tag])
if record.exists():
    verified = verify_image(engine, tag, {"torch": "2.13"}, {}, record=record)
    print(json.dumps({"reused": verified.reused, "problems": verified.problems}))
print(json.dumps({"first": first.image_id, "again": again.image_id, "hits": again.cache_hits,
                  "work": again.work_steps, "sdk": sorted({"docker", "requests", "urllib3", "paramiko"}
                                                          & set(sys.modules))}))
"""


@pytest.fixture
def tag(request):
    name = f"{REPOSITORY}:{request.node.name[:60]}"
    yield name
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True, check=False)


@pytest.mark.docker
def test_a_no_change_rebuild_and_its_verification_import_no_sdk(tmp_path, tag):
    from gpuprov.lab.engine import ensure_engine

    ensure_engine(lambda line: None)
    if socket_path() is None:
        pytest.skip("DOCKER_HOST names no Unix socket")
    context = context_tree(tmp_path / "ctx")
    record = tmp_path / "tiny.versions.json"
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}

    def run() -> list[dict]:
        proc = subprocess.run([sys.executable, "-c", NO_SDK, str(context), tag, str(record)], capture_output=True,
                              text=True, env=env, check=False)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    [built] = run()
    image_id = json.loads(subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True,
                                         check=True).stdout)[0]["Id"]
    # every step but FROM a cache hit: the Dockerfile's and the LABEL step the engine adds for the build-time label
    steps = len((context / "Dockerfile").read_text().splitlines()) - 1 + 1
    assert built["first"] == built["again"] == image_id and built["hits"] == built["work"] == steps
    assert built["sdk"] == []
    # versions read in a container of this image ID before: reused, judged against the spec, still no SDK
    from gpuprov.images.verify import PROBE

    record.write_text(json.dumps({"image_id": image_id, "probe": PROBE, "versions": {"torch": "2.13.0+cpu"}}))
    verified, again = run()
    assert verified == {"reused": True, "problems": []} and again["sdk"] == [] and again["again"] == image_id
