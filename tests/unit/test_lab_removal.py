"""Removing lab containers and networks while the engine is still removing them (a `lab.down` cut short).

The engine's answers are built the way the Docker SDK builds them from an HTTP error (status and JSON `message`
as dockerd sends them), so the code sees exactly the exception classes and texts a real engine gives.
"""

from __future__ import annotations

import json

import docker.errors
import pytest
import requests

from gpuprov.core.errors import GpuprovError
from gpuprov.lab import hosts, removal
from gpuprov.lab.labels import HOST_ROLE, LABEL, PROFILE_LABEL, ROLE_LABEL
from gpuprov.lab.profiles import load_profiles
from gpuprov.lab.state import LabPaths

IN_PROGRESS = "removal of container {id} is already in progress"          # moby daemon/delete.go, 409
ENDPOINTS = "error while removing network: network gpuprov-lab-internal id 1f2e has active endpoints"  # 403
REASONS = {403: "Forbidden", 404: "Not Found", 409: "Conflict", 500: "Internal Server Error"}


def engine_error(status: int, message: str) -> docker.errors.APIError:
    """The exception the Docker SDK raises for this answer of the engine."""
    response = requests.Response()
    response.status_code, response.reason = status, REASONS[status]
    response.url = "http+docker://localhost/v1.41/containers/1f2e?v=True&link=False&force=True"
    response._content = json.dumps({"message": message}).encode()
    try:
        docker.errors.create_api_error_from_http_exception(requests.HTTPError(response=response))
    except docker.errors.APIError as exc:
        return exc
    raise AssertionError("the SDK raised nothing")


def busy(name: str = "gpuprov-lab-01") -> docker.errors.APIError:
    return engine_error(409, IN_PROGRESS.format(id="1f2e" + name))


def gone(name: str = "gpuprov-lab-01") -> docker.errors.APIError:
    return engine_error(404, f"No such container: {name}")


class FakeContainer:
    """A container whose removals get the engine's answers in turn (None: removed)."""

    def __init__(self, name: str, answers: list, status: str = "running", labels: dict | None = None):
        self.name, self.status, self.labels = name, status, labels or {LABEL: "1"}
        self.answers = list(answers)
        self.removals: list[dict] = []
        self.started = False

    def remove(self, **options) -> None:
        self.removals.append(options)
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer

    def start(self) -> None:
        self.started = True


class FakeNetwork(FakeContainer):
    pass


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    monkeypatch.setattr(removal, "POLL_S", 0)


def test_the_sdk_raises_what_these_fakes_raise():
    assert type(busy()) is docker.errors.APIError and busy().status_code == 409
    assert isinstance(gone(), docker.errors.NotFound)


def test_a_removal_in_progress_is_waited_for_until_the_retry_succeeds():
    container = FakeContainer("gpuprov-lab-01", [busy(), busy(), None])
    removal.remove_container(container)
    assert container.removals == [{"force": True, "v": True}] * 3


def test_a_removal_in_progress_that_ends_leaves_the_container_gone():
    container = FakeContainer("gpuprov-lab-01", [busy(), gone()])
    removal.remove_container(container)
    assert len(container.removals) == 2


def test_a_container_already_gone_is_removed():
    container = FakeContainer("gpuprov-lab-01", [gone()])
    removal.remove_container(container)
    assert len(container.removals) == 1


def test_a_removal_that_never_ends_is_a_located_error_after_the_bound():
    container = FakeContainer("gpuprov-lab-02", [busy("gpuprov-lab-02")] * 3)
    with pytest.raises(GpuprovError) as err:
        removal.remove_container(container, timeout_s=0)
    assert len(container.removals) == 1
    error = err.value
    assert (error.host, error.step, error.command) == ("gpuprov-lab-02", "lab remove", "docker rm -f -v gpuprov-lab-02")
    assert error.message.startswith("Docker is still removing container gpuprov-lab-02 after 0 s: removal of")
    assert "dockerd's log" in error.hint


def test_any_other_refusal_is_a_located_error_at_once():
    failed = engine_error(500, "driver \"overlay2\" failed to remove root filesystem: device or resource busy")
    container = FakeContainer("gpuprov-lab-03", [failed, None])
    with pytest.raises(GpuprovError) as err:
        removal.remove_container(container)
    assert len(container.removals) == 1
    assert err.value.message == ("Docker refused to remove container gpuprov-lab-03: driver \"overlay2\" failed "
                                 "to remove root filesystem: device or resource busy")
    assert err.value.host == "gpuprov-lab-03" and err.value.step == "lab remove"


def test_a_network_with_endpoints_still_going_is_waited_for():
    network = FakeNetwork("gpuprov-lab-internal", [engine_error(403, ENDPOINTS), None])
    removal.remove_network(network)
    assert len(network.removals) == 2
    network = FakeNetwork("gpuprov-lab-internal", [engine_error(404, "network gpuprov-lab-internal not found")])
    removal.remove_network(network)


def test_a_network_still_in_use_after_the_bound_names_how_to_see_who_uses_it():
    network = FakeNetwork("gpuprov-lab-internal", [engine_error(403, ENDPOINTS)])
    with pytest.raises(GpuprovError) as err:
        removal.remove_network(network, timeout_s=0)
    assert err.value.command == "docker network inspect gpuprov-lab-internal"
    assert "docker network disconnect -f gpuprov-lab-internal" in err.value.hint


class FakeList:
    def __init__(self, items):
        self.items = items

    def list(self, **_):
        return list(self.items)


class FakeClient:
    def __init__(self, containers, networks=()):
        self.containers, self.networks = FakeList(containers), FakeList(networks)


def test_lab_down_after_a_down_cut_short_removes_everything(tmp_path):
    """The engine is still removing two hosts and the mirror; the network keeps their endpoints a moment."""
    paths = LabPaths(tmp_path)
    for path in (paths.inventory, paths.known_hosts):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    containers = [FakeContainer("gpuprov-lab-01", [busy(), None], status="removing"),
                  FakeContainer("gpuprov-lab-02", [busy("gpuprov-lab-02"), gone("gpuprov-lab-02")], status="removing"),
                  FakeContainer("gpuprov-lab-mirror", [gone("gpuprov-lab-mirror")], status="removing")]
    network = FakeNetwork("gpuprov-lab-internal", [engine_error(403, ENDPOINTS), None])
    lines: list[str] = []
    hosts.remove_lab(FakeClient(containers, [network]), paths, lines.append)
    assert [len(c.removals) for c in containers] == [2, 2, 1] and len(network.removals) == 2
    assert lines == ["host gpuprov-lab-01: removed", "host gpuprov-lab-02: removed",
                     "host gpuprov-lab-mirror: removed", "network gpuprov-lab-internal: removed"]
    assert not paths.inventory.exists() and not paths.known_hosts.exists()


def test_up_replaces_a_host_the_engine_is_removing_instead_of_starting_it(tmp_path, monkeypatch):
    """`lab.up` after a down cut short: a host with every matching label but `removing` is not reused (the
    engine would refuse to start it); its removal is waited out and the host is created again."""
    profile = load_profiles()["l40s"]
    paths = LabPaths(tmp_path)
    (paths.host_keys / "gpuprov-lab-01").mkdir(parents=True)
    (paths.host_keys / "gpuprov-lab-01" / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA root\n")
    labels = {LABEL: "1", ROLE_LABEL: HOST_ROLE, PROFILE_LABEL: "l40s", hosts.PORT_LABEL: str(hosts.host_port(1)),
              hosts.RUN_LABEL: hosts.RUN_DIGEST}
    stale = FakeContainer("gpuprov-lab-01", [busy(), gone()], status="removing", labels=labels)
    stale.image = type("Image", (), {"tags": ["gpuprov-lab/host:abc"]})()
    created = []

    class Booted:
        def __init__(self, name):
            self.name = name

        def reload(self):
            pass

    class Client(FakeClient):
        def __init__(self):
            super().__init__([])
            self.containers.get = Booted

    client = Client()
    monkeypatch.setattr(hosts, "lab_containers", lambda _: [stale])
    monkeypatch.setattr(hosts, "ensure_network", lambda *_: "network")
    monkeypatch.setattr(hosts, "create_host", lambda _c, index, *rest: created.append(index))
    monkeypatch.setattr(hosts, "wait_ready", lambda *_: "running")
    monkeypatch.setattr(hosts, "host_from_container", lambda container: container.name)
    monkeypatch.setattr(hosts, "write_files", lambda *_: None)
    ready = hosts.reconcile(client, [profile], {"bookworm": "gpuprov-lab/host:abc"}, paths, lambda _: None)
    assert len(stale.removals) == 2 and not stale.started
    assert created == [1] and ready == ["gpuprov-lab-01"]
