"""The hardening variables of the inventory: accepted forms, and every bad value as FILE:LINE:COL: key: message."""

from __future__ import annotations

import textwrap

import pytest

from gpuprov.inventory import InventoryError, load_inventory


def load(tmp_path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return path, load_inventory


def errors(tmp_path, text: str) -> tuple:
    path, loader = load(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        loader(path)
    return path, info.value.errors


def test_hardening_variables_merge_like_the_others(tmp_path):
    path, loader = load(tmp_path, """\
        defaults:
          vars:
            cluster_cidrs: [10.1.0.0/16, "fd00:1::/64"]
            monitoring_cidrs: [10.20.0.0/24]
        groups:
          inference:
            vars:
              service_ports:
                - {name: triton-http, port: 8000}
                - {name: node-exporter, port: 9100, sources: monitoring}
                - {name: triton-grpc, port: 8001, proto: tcp, sources: [10.0.0.0/8]}
              ssh_hardening: {permit_root_login: "no", allow_users: [gpuadmin, "ops@10.0.0.0/8"], max_auth_tries: 4}
        hosts:
          inf01: {address: 10.2.0.1, groups: [inference]}
        """)
    host = loader(path).hosts["inf01"]
    assert host.vars["cluster_cidrs"] == ["10.1.0.0/16", "fd00:1::/64"]
    assert host.vars["service_ports"] == [
        {"name": "triton-http", "port": 8000, "proto": "tcp", "sources": None},
        {"name": "node-exporter", "port": 9100, "proto": "tcp", "sources": "monitoring"},
        {"name": "triton-grpc", "port": 8001, "proto": "tcp", "sources": ["10.0.0.0/8"]}]
    assert host.vars["ssh_hardening"] == {"permit_root_login": "no", "allow_users": ["gpuadmin", "ops@10.0.0.0/8"],
                                          "max_auth_tries": 4}


INDENT = 7  # the column a variable starts at in the inventory below


@pytest.mark.parametrize(("value", "at", "message"), [
    ("cluster_cidrs: [10.1.0.1/16]", "10.1", "hosts.h1.vars.cluster_cidrs[0]: bad CIDR '10.1.0.1/16' (host bits set; "
                                             "did you mean 10.1.0.0/16?)"),
    ("service_ports: [{name: 'a b', port: 80}]", "'a b'",
     "hosts.h1.vars.service_ports[0].name: bad service name 'a b': letters, digits, '_', '.' and '-', up to 32"),
    ("service_ports: [{name: web, port: 80, sources: monitor}]", "monitor}",
     "hosts.h1.vars.service_ports[0].sources: bad sources 'monitor': give a list of CIDRs, or monitoring or "
     "cluster (did you mean 'monitoring'?)"),
    ("service_ports: [{name: web}]", "{name", "hosts.h1.vars.service_ports[0]: service port needs port"),
    ("ssh_hardening: {permit_root_login: 'yes'}", "'yes'",
     "hosts.h1.vars.ssh_hardening.permit_root_login: bad permit_root_login 'yes': give prohibit-password or no "
     "(root with a password is never allowed)"),
    ("ssh_hardening: {max_auth_tries: 0}", "0}",
     "hosts.h1.vars.ssh_hardening.max_auth_tries: expected an integer from 1 to 10, not 0"),
    ("ssh_hardening: {ciphers: ['aes256-ctr; reboot']}", "'aes",
     "hosts.h1.vars.ssh_hardening.ciphers[0]: bad algorithm name 'aes256-ctr; reboot': as `ssh -Q` prints them "
     "(like curve25519-sha256)"),
    ("ssh_hardening: {allow_users: ['$(id)']}", "'$",
     "hosts.h1.vars.ssh_hardening.allow_users[0]: bad user name '$(id)': letters, digits, '_', '.', '-' and the "
     "wildcards * and ? (USER@HOST allowed)"),
])
def test_bad_values_are_located(tmp_path, value, at, message):
    path, found = errors(tmp_path, f"""\
        hosts:
          h1:
            address: 10.0.0.1
            vars:
              firewall: {{allow: [{{port: 22, sources: [10.0.0.0/8]}}]}}
              {value}
        """)
    assert found == [f"{path}:6:{INDENT + value.index(at)}: {message}"]


def test_a_service_open_to_a_network_the_host_lacks_is_located_where_it_is_written(tmp_path):
    path, found = errors(tmp_path, """\
        groups:
          exporters:
            vars:
              service_ports:
                - {name: node-exporter, port: 9100, sources: monitoring}
        hosts:
          h1: {address: 10.0.0.1, groups: [exporters]}
          h2: {address: 10.0.0.2, groups: [exporters]}
        """)
    assert found == [f"{path}:5:54: groups.exporters.vars.service_ports[0].sources: node-exporter is open to "
                     "monitoring, but monitoring_cidrs is not set for this host: set monitoring_cidrs (a list of "
                     "CIDRs) where this host gets it"]
