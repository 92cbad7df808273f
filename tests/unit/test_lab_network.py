"""The lab network's subnet and the hosts' addresses, without relying on fields an engine may leave out.

Some engines leave parts of a network's IPAM block empty (the default bridge's Gateway on this project's
engine); the lab keeps the subnet it chose as a label of the network, and reads containers' settings leniently.
"""

from __future__ import annotations

from gpuprov.lab import hosts
from gpuprov.lab.labels import LABEL, NETWORK


class FakeNetwork:
    def __init__(self, attrs: dict, name: str = NETWORK):
        self.name, self.attrs = name, attrs
        self.removed = False

    def remove(self) -> None:
        self.removed = True


class FakeNetworks:
    def __init__(self, existing: list[FakeNetwork], ipam_answer: dict):
        self.existing, self.ipam_answer = existing, ipam_answer
        self.created: list[dict] = []

    def list(self, **_):
        return list(self.existing)

    def create(self, name, **options):
        self.created.append(options)
        # what the engine answers on inspection: the labels as given, the IPAM block as this engine fills it
        return FakeNetwork({"Name": name, "Labels": options["labels"], "IPAM": self.ipam_answer})


class FakeClient:
    def __init__(self, existing=(), ipam_answer=None):
        self.networks = FakeNetworks(list(existing), ipam_answer or {"Driver": "default", "Config": [{}]})


def test_a_new_network_gives_fixed_addresses_though_the_engine_omits_its_subnet():
    client = FakeClient()
    network = hosts.ensure_network(client, lambda _: None)
    [options] = client.networks.created
    assert options["ipam"]["Config"][0]["Subnet"] == "10.213.0.0/24"   # the first of the lab's address plan
    assert options["labels"] == {LABEL: "1", "gpuprov.lab.subnet": "10.213.0.0/24"}
    assert [hosts.host_address(network, index) for index in (1, 2, 3)] == ["10.213.0.11", "10.213.0.12",
                                                                           "10.213.0.13"]


def test_a_labelled_network_is_reused_whatever_its_ipam_block_says():
    existing = FakeNetwork({"Labels": {LABEL: "1", "gpuprov.lab.subnet": "10.214.32.0/24"}, "IPAM": None})
    client = FakeClient([existing])
    assert hosts.ensure_network(client, lambda _: None) is existing
    assert not existing.removed and client.networks.created == []
    assert hosts.host_address(existing, 1) == "10.214.32.11"


def test_a_network_of_an_older_lab_is_read_from_its_ipam_block_or_replaced():
    older = FakeNetwork({"Labels": {LABEL: "1"}, "IPAM": {"Config": [{"Subnet": "10.213.16.0/24"}]}})
    client = FakeClient([older])
    assert hosts.ensure_network(client, lambda _: None) is older and not older.removed
    unknown = FakeNetwork({"Labels": {LABEL: "1"}, "IPAM": {"Config": [{}]}})
    client = FakeClient([unknown])
    lines: list[str] = []
    replaced = hosts.ensure_network(client, lines.append)
    assert unknown.removed and replaced is not unknown and len(client.networks.created) == 1
    assert lines[0] == f"network: replacing {NETWORK} (not on the lab's address plan)"


class FakeContainer:
    name, id, status = "gpuprov-lab-01", "c0ffee", "dead"
    labels = {hosts.PORT_LABEL: "42201", hosts.PROFILE_LABEL: "l40s"}

    def __init__(self, attrs: dict):
        self.attrs = attrs


def test_a_container_without_network_settings_has_no_internal_address():
    for attrs in ({"NetworkSettings": None}, {"NetworkSettings": {"Networks": None}}, {}):
        host = hosts.host_from_container(FakeContainer(attrs))
        assert host.internal_ip is None and host.port == 42201 and host.state == "dead"
    settings = {"NetworkSettings": {"Networks": {NETWORK: {"IPAddress": "10.213.0.11"}}}}
    assert hosts.host_from_container(FakeContainer(settings)).internal_ip == "10.213.0.11"
