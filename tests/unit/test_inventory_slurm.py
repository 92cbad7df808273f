"""An inventory with a `slurm:` source, from `sinfo --json` answers recorded from the lab's slurmctld (Debian's
slurm-wlm 22.05.8) and one built from SchedMD's 22.05.8 source (tests/fixtures/slurm/README.md). The expected
hosts, groups and variables are read off the fixtures' node values by hand: the gres strings, partitions, states
and reasons written there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.inventory import check_fails, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Context

from gpuprov.core.errors import GpuprovError
from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.inventory import slurm as slurm_source
from gpuprov.inventory.slurm import SlurmNode, SlurmSource, gpu_gres, parse_sinfo_json, read_nodes
from gpuprov.tasks import inventory as inventory_tasks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
LAB = (FIXTURES / "sinfo-json_22.05.8_lab.json").read_text()
LAB_DRAINED = (FIXTURES / "sinfo-json_22.05.8_lab-drained.json").read_text()
# gpuprov-lab-02's reason in LAB_DRAINED, as the fixture's JSON string spells it
RECORDED_REASON = 'bad fan | "psu 2" \\ $(id) ; tab\there \u00fcn\u00ef'
MIXED = (FIXTURES / "sinfo-json_22.05.8_mixed.json").read_text()
NO_CONTROLLER = (FIXTURES / "sinfo-json_22.05.8_no-controller.json").read_text()


class Controller:
    """A Slurm controller that answers every command with one recorded (rc, stdout, stderr)."""

    def __init__(self, rc: int, out: str, err: str = ""):
        self.answer = (rc, out, err)
        self.calls: list[tuple[list[str], bool]] = []

    def __call__(self, argv: list[str], admin: bool) -> tuple[int, str, str]:
        self.calls.append((list(argv), admin))
        return self.answer


def answering(text: str):
    """A NodeReader that reads `text` as the controller's sinfo --json, and records the sources it was asked for."""
    asked: list[SlurmSource] = []

    def read(source, inventory):
        asked.append(source)
        return read_nodes(source, Controller(0, text))

    read.asked = asked
    return read


def never(source, inventory):
    raise AssertionError("Slurm was asked although the file is bad")


def test_the_lab_answer_parses_to_its_nodes():
    one = SlurmNode(name="gpuprov-lab-01", partitions=("gpu",), features=(), gres="gpu:h100-sxm:8", state="idle",
                    address="10.213.0.11")
    assert parse_sinfo_json(LAB) == [
        one, SlurmNode(name="gpuprov-lab-02", partitions=("gpu",), features=(), gres="gpu:l40s:4", state="idle",
                       address="10.213.0.12")]
    assert parse_sinfo_json(LAB_DRAINED) == [
        one, SlurmNode(name="gpuprov-lab-02", partitions=("gpu",), features=(), gres="gpu:l40s:4", state="idle",
                       flags=("drain",), reason=RECORDED_REASON, address="10.213.0.12")]


def test_the_data_parser_shape_of_later_slurm_is_read_too():
    """23.02 on (tag slurm-23-02-0-1, src/plugins/data_parser/v0.0.39/parsers.c PARSE_NODE): `state` is the flag
    array of NODE_STATES, `features` and `partitions` lists (CSV_LIST)."""
    answer = {"meta": {}, "errors": [], "nodes": [{
        "name": "gpu07", "state": ["DOWN", "DRAIN", "NOT_RESPONDING"], "features": ["hgx", "ib"],
        "partitions": ["train"], "gres": "gpu:h100:8", "reason": "Kill task failed"}]}
    assert parse_sinfo_json(json.dumps(answer)) == [
        SlurmNode(name="gpu07", partitions=("train",), features=("hgx", "ib"), gres="gpu:h100:8", state="down",
                  flags=("drain", "not_responding"), reason="Kill task failed")]


def test_the_lab_cluster_becomes_hosts_in_its_partition_group(tmp_path):
    path = write(tmp_path, """\
        slurm:
          controller: ctl01
        defaults:
          user: ops
        hosts:
          ctl01: {address: 10.0.0.5}
        """)
    inv = load_inventory(path, slurm=answering(LAB_DRAINED))
    assert inv.format == "native+slurm"
    assert list(inv.hosts) == ["ctl01", "gpuprov-lab-01", "gpuprov-lab-02"]
    assert inv.groups["gpu"].hosts == ("gpuprov-lab-01", "gpuprov-lab-02")
    one, two = inv.hosts["gpuprov-lab-01"], inv.hosts["gpuprov-lab-02"]
    # the address: the node's NodeAddr (the fixture's `address`), as the file gives none
    assert (one.address, one.user, one.port, one.groups) == ("10.213.0.11", "ops", 22, ("gpu",))
    assert (two.address, one.setting_sources["address"]) == ("10.213.0.12", "slurm")
    drained_through = {"kind": "slurm", "controller": "ctl01"}
    assert one.vars == {"hardware": {"gpu": "H100-SXM", "count": 8}, "slurm_gres": "gpu:h100-sxm:8",
                        "slurm_features": [], "slurm_state": "idle", "slurm_reason": "", "scheduler": drained_through}
    assert two.vars == {"hardware": {"gpu": "L40S", "count": 4}, "slurm_gres": "gpu:l40s:4", "slurm_features": [],
                        "slurm_state": "idle+drain", "slurm_reason": RECORDED_REASON, "scheduler": drained_through}
    assert set(one.sources.values()) == {"slurm"}
    assert inv.hosts["ctl01"].vars == {} and inv.hosts["ctl01"].groups == ()


def test_a_production_cluster_maps_gres_types_features_and_states(tmp_path):
    path = write(tmp_path, "slurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    inv = load_inventory(path, slurm=answering(MIXED))
    vars_ = {name: host.vars for name, host in inv.hosts.items()}
    assert vars_["dgx-a01"] == {"hardware": {"gpu": "H100-SXM", "count": 8},
                                "slurm_gres": "gpu:nvidia_h100_80gb_hbm3:8(S:0-1)",
                                "slurm_features": ["hgx", "nvswitch", "ib"], "slurm_state": "mixed", "slurm_reason": "",
                                "scheduler": {"kind": "slurm", "controller": "ctl01"}}
    assert vars_["dgx-a02"]["slurm_state"] == "down+drain+not_responding"
    assert vars_["dgx-a02"]["slurm_reason"] == "Xid 79: GPU fell off the bus | see ticket #4411"
    assert vars_["a40-07"]["hardware"] == {"count": 4}          # a40 is not in gpuprov's catalog
    assert vars_["old-3"]["hardware"] == {"count": 2}           # gpu:2 has no type
    assert "hardware" not in vars_["login-1"]
    assert {name: group.hosts for name, group in inv.groups.items()} == {
        "train": ("dgx-a01", "dgx-a02"), "debug": ("dgx-a01", "old-3", "login-1"), "inference": ("a40-07",)}
    assert inv.hosts["dgx-a01"].groups == ("train", "debug")
    assert slurm_source.unmapped_types(parse_sinfo_json(MIXED)) == {"a40": ["a40-07"]}


@pytest.mark.parametrize(("gres", "expected"), [
    ("gpu:h100-sxm:8", ("h100-sxm", 8)),
    ("gpu:nvidia_h100_80gb_hbm3:8(S:0-1)", ("nvidia_h100_80gb_hbm3", 8)),
    ("gpu:8", (None, 8)),
    ("gpu:a100:4,gpu:t4:2", (None, 6)),
    ("nvme:1,gpu:l40s:2", ("l40s", 2)),
    ("gpu", (None, 1)),
    ("", (None, 0)),
    ("nvme:1", (None, 0)),
])
def test_gpu_gres(gres, expected):
    assert gpu_gres(gres) == expected


@pytest.mark.parametrize(("gres_type", "key"), [
    ("h100-sxm", "H100-SXM"), ("l40s", "L40S"), ("nvidia_h100_80gb_hbm3", "H100-SXM"), ("nvidia_a100-sxm4-80gb",
                                                                                        "A100-SXM4-80GB"),
    ("nvidia_l40s", "L40S"), ("a40", None), ("mi300x", None),
])
def test_gres_types_found_in_the_catalog(gres_type, key):
    assert slurm_source.catalog_gpu(gres_type) == key


def test_the_partition_filter_keeps_its_partitions_only(tmp_path):
    path = write(tmp_path, "slurm: {controller: ctl01, partitions: [train]}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    inv = load_inventory(path, slurm=answering(MIXED))
    assert list(inv.hosts) == ["ctl01", "dgx-a01", "dgx-a02"]
    assert list(inv.groups) == ["train"]
    assert inv.hosts["dgx-a01"].groups == ("train",)


def test_a_filtered_partition_slurm_lacks_is_a_located_error(tmp_path):
    path = write(tmp_path, "slurm:\n  controller: ctl01\n  partitions: [train, trian2]\nhosts:\n"
                           "  ctl01: {address: 10.0.0.5}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=answering(MIXED))
    assert info.value.errors == [f"{path}:3:23: slurm.partitions[1]: sinfo --json on ctl01 lists no partition "
                                 "'trian2' (did you mean 'train'?)"]


def test_the_file_wins_over_slurm_host_then_groups_then_defaults(tmp_path):
    path = write(tmp_path, """\
        slurm: {controller: ctl01}
        defaults:
          vars: {slurm_reason: from defaults}
        groups:
          train:
            vars: {slurm_features: [from-group]}
          hgx:
            vars: {hardware: {gpu: H100-SXM, count: 8, nvswitch: true}}
        hosts:
          ctl01: {address: 10.0.0.5}
          dgx-a01:
            address: 10.20.0.101
            port: 2222
            groups: [hgx]
            vars: {slurm_state: from host}
        """)
    host = load_inventory(path, slurm=answering(MIXED)).hosts["dgx-a01"]
    assert (host.address, host.port) == ("10.20.0.101", 2222)
    assert host.groups == ("train", "debug", "hgx")        # Slurm's partitions, then the file's groups
    assert host.vars == {"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True},
                         "slurm_gres": "gpu:nvidia_h100_80gb_hbm3:8(S:0-1)", "slurm_features": ["from-group"],
                         "slurm_state": "from host", "slurm_reason": "from defaults",
                         "scheduler": {"kind": "slurm", "controller": "ctl01"}}
    assert host.sources == {"hardware": "group:hgx", "slurm_gres": "slurm", "slurm_features": "group:train",
                            "slurm_state": "host", "slurm_reason": "defaults", "scheduler": "slurm"}


def test_a_host_slurm_lacks_stays_as_the_file_gives_it(tmp_path):
    path = write(tmp_path, "slurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5, vars: {x: 1}}\n")
    inv = load_inventory(path, slurm=answering(LAB))
    assert inv.hosts["ctl01"].vars == {"x": 1} and inv.hosts["ctl01"].sources == {"x": "host"}


def test_errors_in_the_file_are_located_as_today_and_slurm_is_not_asked(tmp_path):
    path = write(tmp_path, """\
        slurm:
          controller: ctl02
          partition: [gpu]
        hosts:
          ctl01: {address: 10.0.0.5, port: 0}
        """)
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=never)
    assert info.value.errors == [
        f"{path}:2:15: slurm.controller: unknown host 'ctl02' (did you mean 'ctl01'?): the controller is a host of "
        "this inventory, or 'local'",
        f"{path}:3:3: slurm.partition: unknown slurm key 'partition' (did you mean 'partitions'?); expected one of: "
        "controller, partitions",
        f"{path}:5:36: hosts.ctl01.port: bad port 0: give an integer from 1 to 65535",
    ]


@pytest.mark.parametrize(("block", "error"), [
    ("slurm: [ctl01]", "1:8: slurm: slurm must be a mapping, not a list"),
    ("slurm: {partitions: [gpu]}", "1:8: slurm: slurm needs controller: an inventory host or 'local'"),
    ("slurm: {controller: 7}", "1:21: slurm.controller: controller must be an inventory host or 'local', not 7"),
    ("slurm: {controller: ''}", "1:21: slurm.controller: controller must be an inventory host or 'local', not ''"),
    ("slurm: {controller: local, partitions: gpu}", "1:40: slurm.partitions: partitions must be a non-empty list of "
                                                    "partition names, not 'gpu'"),
    ("slurm: {controller: local, partitions: ['a b']}", "1:41: slurm.partitions[0]: bad group name 'a b': use "
                                                        "letters, digits, '.', '_' and '-'"),
])
def test_a_bad_slurm_block_is_a_located_error(tmp_path, block, error):
    path = write(tmp_path, block + "\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=never)
    assert info.value.errors == [f"{path}:{error}"]


def test_the_reader_gets_the_block_and_the_file_s_inventory(tmp_path):
    path = write(tmp_path, "slurm: {controller: local, partitions: [gpu]}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    reader = answering(LAB)
    load_inventory(path, slurm=reader)
    assert reader.asked == [SlurmSource("local", ("gpu",))]


def test_a_failed_sinfo_names_the_command_and_the_controller():
    run = Controller(1, "", "sinfo: unrecognized option '--json'\nTry \"sinfo --help\" for more information\n")
    with pytest.raises(GpuprovError) as info:
        read_nodes(SlurmSource("ctl01"), run)
    exc = info.value
    assert exc.message == "sinfo --json failed (exit 1, on the Slurm controller ctl01)"
    assert (exc.host, exc.step, exc.command) == ("ctl01", "inventory.slurm", "sinfo --json")
    assert exc.output.startswith("sinfo: unrecognized option '--json'")
    assert run.calls == [(["sinfo", "--json"], True)]


@pytest.mark.parametrize(("out", "why"), [
    (NO_CONTROLLER, "Slurm reported errors: [{'error': 'Unspecified error', 'errno': -1}]"),
    ("Unable to contact slurm controller", "not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("[]", "no list of nodes: expected a mapping with nodes: [...]"),
    ('{"nodes": [{"name": "n1", "partitions": "gpu"}]}', "node 'n1': partitions is not a list of names"),
    ('{"nodes": [{"name": "n1", "reason": 5}]}', "node 'n1': reason is int, not text"),
    ('{"nodes": [{"state": "idle"}]}', "nodes[0] has no name"),
    ('{"nodes": [7]}', "nodes[0] is int, not a mapping"),
    ('{"nodes": [{"name": "n1", "gres": "gpu:h100:999999999999999999999"}]}',        # past a uint64's 20 digits
     "node 'n1': gres entry 'gpu:h100:999999999999999999999' is not gpu[:type][:count]"),
    ('{"nodes": [{"name": "n1", "gres": "nvme:1,gpu:a:b:c"}]}', "node 'n1': gres entry 'gpu:a:b:c' is not "
                                                                  "gpu[:type][:count]"),
])
def test_an_answer_gpuprov_cannot_read_is_a_clear_error(out, why):
    with pytest.raises(GpuprovError) as info:
        read_nodes(SlurmSource("local"), Controller(0, out))
    assert info.value.message == (f"sinfo --json on the Slurm controller this machine printed what gpuprov cannot "
                                  f"read: {why}")
    assert info.value.command == "sinfo --json"


def test_the_local_runner_runs_no_shell(monkeypatch):
    seen = {}

    class Done:
        returncode, stdout, stderr = 0, "{}", ""

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, **kwargs)
        return Done()

    monkeypatch.setattr(slurm_source.subprocess, "run", fake_run)
    assert slurm_source.run_local(["sinfo", "--json"], True) == (0, "{}", "")
    assert seen["argv"] == ["sinfo", "--json"] and not seen.get("shell")


def _one_node(name: str, reason: str, partition: str = "gpu") -> str:
    node = json.loads(LAB)["nodes"][1]
    node.update(name=name, reason=reason, partitions=[partition], address=name)   # NodeAddr defaults to NodeName
    return json.dumps({"meta": {}, "errors": [], "nodes": [node]})


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reason=st.text(max_size=200))
def test_any_reason_is_read_as_it_is(reason):
    (node,) = parse_sinfo_json(_one_node("n1", reason))
    assert node.reason == reason and node.name == "n1"


NAMES = st.one_of(st.text(min_size=1, max_size=80), st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, reason=st.text(max_size=80), partition=NAMES)
def test_a_hostile_node_name_is_a_located_error_and_never_reaches_a_command(tmp_path, name, reason, partition):
    path = write(tmp_path, "slurm:\n  controller: ctl01\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    run = Controller(0, _one_node(name, reason, partition))
    try:
        inv = load_inventory(path, slurm=lambda source, inv: read_nodes(source, run))
    except InventoryError as exc:
        assert all(line.startswith(f"{path}:1:1: slurm: ") for line in exc.errors)
        assert all("\n" not in line for line in exc.errors)
    else:
        assert inv.hosts[name].vars["slurm_reason"] == reason and inv.groups[partition].hosts == (name,)
    assert run.calls == [(["sinfo", "--json"], True)]


def test_every_lab_gres_type_maps_back_to_its_catalog_model():
    from gpuprov.catalog import models
    from gpuprov.lab.slurm import gres_type

    assert {key: slurm_source.catalog_gpu(gres_type(key)) for key in models()} == {key: key for key in models()}


def test_the_controller_is_read_over_the_rollout_s_ssh_runner_and_closed(tmp_path, monkeypatch):
    import gpuprov.core.controller as connect

    made = []

    class FakeRunner(Controller):
        def __init__(self, host, settings, jump=None):
            super().__init__(0, LAB)
            self.host, self.settings, self.jump, self.closed = host, settings, jump, False
            made.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(connect, "ControllerRunner", FakeRunner)
    path = write(tmp_path, """\
        slurm: {controller: ctl01}
        hosts:
          bastion: {address: 192.0.2.1}
          ctl01: {address: 10.0.0.5, user: ops, jump: bastion}
        """)
    fleet_settings = object()
    inv = load_inventory(path, slurm=slurm_source.nodes_via(fleet_settings))
    (runner,) = made
    assert (runner.host.name, runner.host.user, runner.jump.name) == ("ctl01", "ops", "bastion")
    assert runner.settings is fleet_settings and runner.closed
    assert runner.calls == [(["sinfo", "--json"], True)]
    assert "gpuprov-lab-01" in inv.hosts


# -- the default reader: every load_inventory call reads the controller ---------------------------------------------

def fake_sinfo(tmp_path: Path, monkeypatch, answer: str) -> Path:
    """A `sinfo` first on PATH that prints `answer` and appends its arguments to the file it returns."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "answer.json").write_text(answer)
    calls = bin_dir / "calls"
    script = bin_dir / "sinfo"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\ncat "{bin_dir / "answer.json"}"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_a_slurm_only_inventory_runs_sinfo_here_and_lists_slurm_s_nodes(tmp_path, monkeypatch):
    calls = fake_sinfo(tmp_path, monkeypatch, MIXED)
    path = write(tmp_path, "slurm: {controller: local}\ndefaults: {user: ops, port: 2222}\n")
    inv = load_inventory(path)
    assert calls.read_text() == "--json\n"
    assert list(inv.hosts) == ["dgx-a01", "dgx-a02", "a40-07", "old-3", "login-1"]
    assert {name: (h.user, h.port, h.address) for name, h in inv.hosts.items()} == {
        "dgx-a01": ("ops", 2222, "10.20.0.1"), "dgx-a02": ("ops", 2222, "10.20.0.2"),
        "a40-07": ("ops", 2222, "10.20.1.7"), "old-3": ("ops", 2222, "10.20.2.3"),
        "login-1": ("ops", 2222, "10.20.3.1")}
    assert not any("scheduler" in h.vars for h in inv.hosts.values())    # `local` is no host to drain through
    assert inv.warnings == [f"{path}:1:1: slurm: gres type 'a40' (a40-07) is not in gpuprov's catalog: those hosts "
                            "get hardware.count only; give their hardware.gpu in the file"]


def test_an_empty_hosts_mapping_is_allowed_beside_slurm(tmp_path, monkeypatch):
    fake_sinfo(tmp_path, monkeypatch, LAB)
    path = write(tmp_path, "slurm: {controller: local}\nhosts: {}\n")
    assert list(load_inventory(path).hosts) == ["gpuprov-lab-01", "gpuprov-lab-02"]


def test_no_host_at_all_is_a_located_error(tmp_path, monkeypatch):
    fake_sinfo(tmp_path, monkeypatch, json.dumps({"meta": {}, "errors": [], "nodes": []}))
    path = write(tmp_path, "defaults: {user: ops}\nslurm: {controller: local}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.errors == [f"{path}:2:1: slurm: no hosts: sinfo --json on this machine lists no nodes, and "
                                 "the file lists no hosts"]


def test_a_misspelt_slurm_key_is_suggested(tmp_path):
    path = write(tmp_path, "slrum: {controller: local}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=never)
    assert info.value.errors == [f"{path}:1:1: slrum: unknown top-level key 'slrum' (did you mean 'slurm'?); "
                                 "expected one of: hosts, groups, defaults, known_hosts, slurm"]


def test_inventory_check_lists_slurm_s_hosts_and_groups(tmp_path, monkeypatch, capsys):
    fake_sinfo(tmp_path, monkeypatch, LAB_DRAINED)
    path = write(tmp_path, "slurm: {controller: local, partitions: [gpu]}\ndefaults: {user: ops}\n")
    inventory_tasks.check(Context(), inventory=str(path))
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: ok (native+slurm format): 2 hosts, 1 group", "hosts: gpuprov-lab-01, gpuprov-lab-02",
        "groups: gpu"]


def test_inventory_check_tells_the_file_s_errors_before_any_controller_is_asked(tmp_path, monkeypatch, capsys):
    calls = fake_sinfo(tmp_path, monkeypatch, LAB)
    path = write(tmp_path, "slurm: {controller: local, partitions: gpu}\ndefaults: {port: 70000}\n")
    assert check_fails(path, capsys) == [
        f"{path}:1:40: slurm.partitions: partitions must be a non-empty list of partition names, not 'gpu'",
        f"{path}:2:18: defaults.port: bad port 70000: give an integer from 1 to 65535",
        f"2 errors in {path}"]
    assert not calls.exists()


def test_inventory_show_gives_a_node_s_slurm_facts(tmp_path, monkeypatch, capsys):
    fake_sinfo(tmp_path, monkeypatch, LAB_DRAINED)
    path = write(tmp_path, "slurm: {controller: local}\n")
    inventory_tasks.show(Context(), host="gpuprov-lab-02", inventory=str(path), json_=True)
    shown = json.loads(capsys.readouterr().out)
    assert shown["groups"] == ["gpu"]
    assert {k: shown["vars"][k] for k in ("hardware", "slurm_state", "slurm_reason")} == {
        "hardware": {"gpu": "L40S", "count": 4}, "slurm_state": "idle+drain", "slurm_reason": RECORDED_REASON}


@pytest.mark.parametrize(("hosts", "groups", "expected"), [
    ([], ["gpu"], ["gpuprov-lab-01", "gpuprov-lab-02"]),
    (["gpuprov-lab-02"], [], ["gpuprov-lab-02"]),
])
def test_host_tasks_select_slurm_s_nodes_by_partition_or_name(tmp_path, monkeypatch, hosts, groups, expected):
    from gpuprov.tasks._common import select_hosts

    fake_sinfo(tmp_path, monkeypatch, LAB)
    path = write(tmp_path, "slurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    monkeypatch.setattr(slurm_source, "runner_for", lambda source, inventory, settings: slurm_source.run_local)
    _, chosen = select_hosts(Context(), hosts, groups, False, str(path), connects=False)
    assert [h.name for h in chosen] == expected


def test_the_default_reader_uses_the_file_s_known_hosts_and_gpuprov_s_timeouts(tmp_path, monkeypatch):
    import gpuprov.core.controller as connect

    made = []

    class FakeRunner(Controller):
        def __init__(self, host, settings, jump=None):
            super().__init__(0, LAB)
            self.settings = settings
            made.append(self)

    monkeypatch.setattr(connect, "ControllerRunner", FakeRunner)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "invoke.yaml").write_text(f"gpuprov:\n  connect_timeout: 7\n  connect_retries: 1\n"
                                          f"  known_hosts: {tmp_path / 'config_known_hosts'}\n")
    monkeypatch.setenv("INVOKE_GPUPROV_CONNECT_RETRIES", "0")
    fleet = write(tmp_path, "known_hosts: fleet_known_hosts\nslurm: {controller: ctl01}\nhosts:\n"
                            "  ctl01: {address: 10.0.0.5}\n", name="fleet.yaml")
    plain = write(tmp_path, "slurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5}\n")
    load_inventory(fleet)
    load_inventory(plain)
    assert [(r.settings.known_hosts, r.settings.trust_new, r.settings.connect_timeout, r.settings.connect_retries)
            for r in made] == [(tmp_path / "fleet_known_hosts", False, 7, 0),
                               (tmp_path / "config_known_hosts", False, 7, 0)]


def failing_runner(monkeypatch, error: GpuprovError) -> list:
    """ControllerRunner replaced by one whose command raises `error`; returns the runners made (closed or not)."""
    import gpuprov.core.controller as connect

    made = []

    class Failing:
        def __init__(self, host, settings, jump=None):
            self.closed = False
            made.append(self)

        def __call__(self, argv, admin):
            raise error

        def close(self):
            self.closed = True

    monkeypatch.setattr(connect, "ControllerRunner", Failing)
    return made


CONTROLLER_FILE = "known_hosts: kh\nslurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5, port: 2201}\n"


def test_a_controller_that_cannot_be_reached_names_host_step_command_and_what_to_do(tmp_path, monkeypatch):
    from gpuprov.core.connection import ConnectError

    made = failing_runner(monkeypatch, ConnectError("cannot reach 10.0.0.5:2201 after 3 attempts: timed out",
                                                    host="ctl01", step="connect", hint="check that ctl01 is up"))
    with pytest.raises(GpuprovError) as info:
        load_inventory(write(tmp_path, CONTROLLER_FILE))
    exc = info.value
    assert exc.exit_code == 1 and made[0].closed
    assert exc.message == ("cannot read Slurm's nodes from the controller ctl01: cannot reach 10.0.0.5:2201 after 3 "
                           "attempts: timed out")
    assert (exc.host, exc.step, exc.command) == ("ctl01", "inventory.slurm", "sinfo --json")
    assert exc.hint == ("check that ctl01 is up; every task that loads this inventory reads Slurm's nodes on that "
                        "host first: fix the connection, or name another host with the Slurm client (or 'local') as "
                        "slurm.controller")


def test_an_unknown_controller_key_says_how_to_record_it_by_hand(tmp_path, monkeypatch):
    from gpuprov.core.connection import HostKeyError

    failing_runner(monkeypatch, HostKeyError("unknown host key ssh-ed25519 SHA256:x for [10.0.0.5]:2201",
                                             host="ctl01", step="connect", hint="rerun with --trust-new-hosts"))
    with pytest.raises(GpuprovError) as info:
        load_inventory(write(tmp_path, CONTROLLER_FILE))
    assert info.value.hint.startswith(f"check the key's fingerprint out of band, then add its line for "
                                      f"[10.0.0.5]:2201 to {tmp_path / 'kh'} (ssh-keyscan -p 2201 10.0.0.5 prints "
                                      "it); every task")
    assert "--trust-new-hosts" not in info.value.hint


def test_bad_input_on_the_way_to_the_controller_stays_bad_input(tmp_path, monkeypatch):
    from gpuprov.core.errors import InputError

    error = InputError("the sudo password variable CTL_PW is not set", host="ctl01", step="sudo")
    failing_runner(monkeypatch, error)
    with pytest.raises(InputError) as info:
        load_inventory(write(tmp_path, CONTROLLER_FILE))
    assert info.value is error and info.value.exit_code == 2


PARTITION = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
NODE = st.from_regex(r"[a-z]([a-z0-9-]{0,28}[a-z0-9])?", fullmatch=True)   # a DNS name: the host's address


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.dictionaries(NODE, st.lists(PARTITION, min_size=1, max_size=3, unique=True), min_size=1,
                              max_size=6))
def test_every_partition_selects_its_nodes_and_every_node_its_name(tmp_path, layout):
    """Node names that are DNS names (the address of a node the file gives none), any partition name a group can
    have: --group PARTITION selects the nodes sinfo lists in it, in sinfo's order; --host NODE that node."""
    template = json.loads(LAB)["nodes"][0]
    nodes = [{**template, "name": name, "partitions": parts} for name, parts in layout.items()]
    answer = json.dumps({"meta": {}, "errors": [], "nodes": nodes})
    path = write(tmp_path, "slurm: {controller: local}\n")
    inv = load_inventory(path, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    for part in {p for parts in layout.values() for p in parts}:
        chosen = inv.select(hosts=[], groups=[part], all_=False)
        assert [h.name for h in chosen] == [name for name, parts in layout.items() if part in parts]
    for name in layout:
        assert [h.name for h in inv.select(hosts=[name], groups=[], all_=False)] == [name]


def test_a_node_whose_name_is_no_address_needs_one_in_the_file(tmp_path):
    answer = _one_node("0", "")
    path = write(tmp_path, "slurm: {controller: local}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    assert info.value.errors == [f"{path}:1:1: slurm: host '0' has no address and its name is not a host name or IP "
                                 "address: give address:"]
    fixed = write(tmp_path, "slurm: {controller: local}\nhosts:\n  '0': {address: 192.0.2.7}\n")
    inv = load_inventory(fixed, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    assert (inv.hosts["0"].address, inv.hosts["0"].groups) == ("192.0.2.7", ("gpu",))


# -- MIG: a gres of MIG slices is no GPU count ----------------------------------------------------------------------

@pytest.mark.parametrize("gres", [
    "gpu:nvidia_a100_3g.40gb:14(S:0-1)",          # AutoDetect=nvml: 2 A100s in 7 slices each
    "gpu:3g.40gb:4,gpu:1g.10gb:6",                # gres.conf types named after the profiles
    "gpu:nvidia_h100_80gb_hbm3_1g.10gb+me:2,gpu:nvidia_h100_80gb_hbm3:7",
])
def test_a_node_with_mig_slices_gets_no_gpu_count_and_a_located_warning(tmp_path, gres):
    node = {**json.loads(LAB)["nodes"][0], "name": "mig-01", "gres": gres}
    answer = json.dumps({"meta": {}, "errors": [], "nodes": [node]})
    path = write(tmp_path, "slurm: {controller: local}\n")
    inv = load_inventory(path, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    assert "hardware" not in inv.hosts["mig-01"].vars
    assert inv.hosts["mig-01"].vars["slurm_gres"] == gres
    assert len(inv.warnings) == 1
    assert inv.warnings[0].startswith(f"{path}:1:1: slurm: MIG slices in the gres of mig-01 (")
    assert "give their hardware.count (the physical GPUs)" in inv.warnings[0]


def test_a_gres_type_that_only_looks_like_memory_is_no_mig_slice():
    assert slurm_source.mig_types("gpu:nvidia_h100_80gb_hbm3:8(S:0-1),gpu:a100-sxm4-80gb:2") == []
    assert slurm_source.mig_types("gpu:nvidia_a100_3g.40gb:14,nvme:1") == ["nvidia_a100_3g.40gb"]


# -- a node's address is its NodeAddr; a node the file lists under another name is refused --------------------------

def test_a_file_host_with_the_node_s_address_under_another_name_is_refused(tmp_path):
    path = write(tmp_path, """\
        slurm: {controller: ctl01}
        hosts:
          ctl01: {address: 10.0.0.5}
          dgx-a01-ib: {address: 10.20.0.1}
        """)
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=answering(MIXED))
    assert info.value.errors == [f"{path}:1:1: slurm: Slurm node 'dgx-a01' (sinfo --json on ctl01) is the file's host "
                                 "'dgx-a01-ib' (its address 10.20.0.1 is the node's NodeAddr): the same machine would "
                                 "be two hosts; name that host 'dgx-a01' in the file"]


def test_a_file_host_whose_scheduler_node_is_a_slurm_node_is_refused(tmp_path):
    path = write(tmp_path, """\
        slurm: {controller: ctl01}
        hosts:
          ctl01: {address: 10.0.0.5}
          trainer-7:
            address: 192.0.2.7
            vars:
              scheduler: {kind: slurm, controller: ctl01, node: old-3}
        """)
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=answering(MIXED))
    assert info.value.errors == [f"{path}:1:1: slurm: Slurm node 'old-3' (sinfo --json on ctl01) is the file's host "
                                 "'trainer-7' (its scheduler.node is old-3): the same machine would be two hosts; "
                                 "name that host 'old-3' in the file"]


def test_a_node_the_file_lists_by_its_name_keeps_the_file_s_address(tmp_path):
    path = write(tmp_path, "slurm: {controller: ctl01}\nhosts:\n  ctl01: {address: 10.0.0.5}\n"
                           "  dgx-a01: {address: 10.99.0.1}\n")
    inv = load_inventory(path, slurm=answering(MIXED))
    assert (inv.hosts["dgx-a01"].address, inv.hosts["dgx-a02"].address) == ("10.99.0.1", "10.20.0.2")


def test_a_node_addr_that_is_no_address_is_a_located_error_unless_the_file_gives_one(tmp_path):
    node = {**json.loads(LAB)["nodes"][0], "name": "gpu01", "address": "gpu01;reboot"}
    answer = json.dumps({"meta": {}, "errors": [], "nodes": [node]})
    path = write(tmp_path, "slurm: {controller: local}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    assert info.value.errors == [f"{path}:1:1: slurm: Slurm node 'gpu01' (sinfo --json on this machine) has the "
                                 "NodeAddr 'gpu01;reboot', which is not a host name or IP address: give the host's "
                                 "address: in the file"]
    fixed = write(tmp_path, "slurm: {controller: local}\nhosts:\n  gpu01: {address: 192.0.2.9}\n")
    inv = load_inventory(fixed, slurm=lambda source, inv: read_nodes(source, Controller(0, answer)))
    assert inv.hosts["gpu01"].address == "192.0.2.9"
