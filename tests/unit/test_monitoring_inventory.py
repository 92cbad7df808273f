"""The monitoring variables of the inventory: accepted forms, and every bad value as FILE:LINE:COL: key: message;
the file_sd targets made from them."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.monitoring.policy import build_policy
from gpuprov.monitoring.targets import file_sd, file_sd_text, target_labels

INVENTORY = """\
    defaults:
      vars:
        cost: {per_hour: 98.32, currency: EUR}
        monitoring: {drift_interval_min: 2}
    groups:
      gpu: {children: [hgx]}
      hgx:
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
          stack: {driver: "570", cuda: "12.8"}
      cpu:
        vars:
          monitoring: {dcgm_exporter: none}
          cost: {per_hour: 1.5}
    hosts:
      hgx-01: {address: 10.1.0.11, groups: [hgx], vars: {monitoring_address: 10.20.1.11}}
      hgx-02: {address: 10.1.0.12, groups: [hgx]}
      prom: {address: "fd00::9", groups: [cpu]}
"""


def load(tmp_path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return load_inventory(path)


def errors(tmp_path, text: str) -> list[str]:
    with pytest.raises(InventoryError) as info:
        load(tmp_path, text)
    return info.value.errors


def test_policy_defaults_and_overrides(tmp_path):
    inv = load(tmp_path, INVENTORY)
    one, two, prom = (build_policy(inv.host(name)) for name in ("hgx-01", "hgx-02", "prom"))
    assert (one.address, one.node_exporter_listen, one.dcgm_exporter_listen) == (
        "10.20.1.11", "10.20.1.11:9100", "10.20.1.11:9400")
    assert two.address == "10.1.0.12" and two.dcgm_exporter == "auto" and two.drift_interval_min == 2
    assert (two.cost_per_hour, two.currency, two.validate_schedule) == (98.32, "EUR", "weekly")
    # a group's `monitoring` replaces the defaults' mapping whole, as every variable merges
    assert prom.dcgm_exporter == "none" and prom.drift_interval_min == 5
    assert prom.node_exporter_listen == "[fd00::9]:9100"
    assert (prom.cost_per_hour, prom.currency) == (1.5, "USD")


def test_targets_carry_the_inventory_labels(tmp_path):
    inv = load(tmp_path, INVENTORY)
    jobs = file_sd(inv, list(inv.hosts.values()), {"hgx-02": {"driver": {"version": "570.148.08"},
                                                              "cuda": {"version": "12.8.1"},
                                                              "nccl": {"version": "2.26.5"}}})
    node = {entry["labels"]["host"]: entry for entry in jobs["gpuprov-node"]}
    assert node["hgx-01"] == {"targets": ["10.20.1.11:9100"], "labels": {
        "host": "hgx-01", "groups": ",gpu,hgx,", "gpu_model": "H100-SXM", "gpu_count": "8", "driver": "570",
        "cuda": "12.8", "cost_per_hour": "98.32"}}
    # the lock's stack wins over the inventory's pins
    assert {k: node["hgx-02"]["labels"][k] for k in ("driver", "cuda", "nccl")} == {
        "driver": "570.148.08", "cuda": "12.8.1", "nccl": "2.26.5"}
    assert node["prom"]["targets"] == ["[fd00::9]:9100"]
    assert [e["labels"]["host"] for e in jobs["gpuprov-dcgm"]] == ["hgx-01", "hgx-02"]   # prom has none
    assert jobs["gpuprov-dcgm"][0]["targets"] == ["10.20.1.11:9400"]
    # file_sd wants string label values, and the file is stable JSON
    text = file_sd_text(jobs["gpuprov-node"])
    assert all(isinstance(v, str) for entry in json.loads(text) for v in entry["labels"].values())
    assert text == file_sd_text(json.loads(text))


@pytest.mark.parametrize("snippet, expected", [
    ("monitoring_address: 'a b'", "hosts.h.vars.monitoring_address: bad monitoring_address 'a b'"),
    ("monitoring: {dcgm_exporter: containers}", "did you mean 'container'"),
    ("monitoring: {dcgm_exporter_image: 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1'}", "without a tag"),
    ("monitoring: {drift_interval_min: 0}", "expected an integer from 1 to 15, not 0"),
    ("monitoring: {drift_interval_min: 20}", "expected an integer from 1 to 15, not 20"),
    ("monitoring: {validate_schedule: 'weekly; rm -rf /'}", "bad validate_schedule"),
    ("monitoring: {scrape_interval_s: true}", "expected an integer from 1 to 3600, not True"),
    ("monitoring: {idle: 5}", "'idle'; expected one of: dcgm_exporter,"),
    ("monitoring: {dcgm_exporter_digests: sha256:00}", "bad dcgm_exporter_digests 'sha256:00'"),
    ("monitoring: {dcgm_exporter_digests: {4.4.1-4.6.0-ubuntu22.04: 'sha256:AB'}}", "bad image digest 'sha256:AB'"),
    ("monitoring: {dcgm_exporter_digests: {4.4.1-4.6.0-ubuntu22.04: latest}}", "bad image digest 'latest'"),
    ("monitoring: {dcgm_exporter_digests: {'a b': 'sha256:" + "0" * 64 + "'}}", "bad image tag 'a b'"),
    ("cost: {currency: USD}", "cost needs per_hour"),
    ("cost: {per_hour: -1}", "bad per_hour -1"),
    ("cost: {per_hour: 3, currency: usd}", "bad currency 'usd'"),
])
def test_bad_monitoring_variables_are_located(tmp_path, snippet, expected):
    found = errors(tmp_path, f"hosts:\n  h:\n    address: 10.0.0.1\n    vars: {{{snippet}}}\n")
    assert len(found) == 1 and found[0].startswith(f"{tmp_path / 'inv.yaml'}:4:"), found
    assert expected in found[0]


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_schedule_text_is_accepted_only_without_shell_characters(tmp_path_factory, text):
    """The schedule goes into a unit file: whatever is accepted has no newline, quote or shell character."""
    folder = tmp_path_factory.mktemp("inv")
    path = folder / "inv.yaml"
    document = {"hosts": {"h": {"address": "10.0.0.1", "vars": {"monitoring": {"validate_schedule": text}}}}}
    path.write_text(yaml.safe_dump(document))
    try:
        inv = load_inventory(path)
    except InventoryError as exc:
        assert any("validate_schedule" in line for line in exc.errors)
        return
    accepted = inv.host("h").vars["monitoring"]["validate_schedule"]
    assert accepted == text and not set(text) & set("\n\r\"'`$;&|<>()\\{}[]")


def test_a_host_without_gpus_gets_no_dcgm_target_unless_its_mode_names_one(tmp_path):
    inv = load(tmp_path, "hosts:\n  cpu: {address: 10.0.0.7}\n"
                         "  forced: {address: 10.0.0.8, vars: {monitoring: {dcgm_exporter: service}}}\n")
    jobs = file_sd(inv, list(inv.hosts.values()), {})
    assert [e["labels"]["host"] for e in jobs["gpuprov-node"]] == ["cpu", "forced"]
    assert [e["labels"]["host"] for e in jobs["gpuprov-dcgm"]] == ["forced"]


def test_target_labels_leave_out_what_the_inventory_does_not_know(tmp_path):
    inv = load(tmp_path, "hosts:\n  bare: {address: 10.0.0.7}\n")
    assert target_labels(inv.host("bare"), [], None) == {"host": "bare", "groups": ",,"}


def test_the_textfile_folder_is_validates_own(tmp_path):
    inv = load(tmp_path, "hosts:\n  h: {address: 10.0.0.7, vars: {validate: {textfile_dir: /srv/textfiles/}}}\n")
    assert build_policy(inv.host("h")).textfile_dir == "/srv/textfiles"
    found = errors(tmp_path, "hosts:\n  bad: {address: 10.0.0.8, vars: {validate: {textfile_dir: 'rel/dir'}}}\n")
    assert found == [f"{tmp_path}/inv.yaml:2:60: hosts.bad.vars.validate.textfile_dir: must be an absolute path "
                     "(letters, digits, _ . + @ / -), not 'rel/dir'; give a folder only root writes, like "
                     "/var/lib/prometheus/node-exporter"]


def test_a_pinned_dcgm_exporter_digest_reaches_the_policy(tmp_path):
    digest = "sha256:" + "0f" * 32
    inv = load(tmp_path, "hosts:\n  h:\n    address: 10.0.0.7\n    vars: {monitoring: {dcgm_exporter_digests: "
                         f"{{4.4.1-4.6.0-ubuntu22.04: '{digest}'}}}}}}\n")
    assert build_policy(inv.host("h")).dcgm_exporter_digests == {"4.4.1-4.6.0-ubuntu22.04": digest}
