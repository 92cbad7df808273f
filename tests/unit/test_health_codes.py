"""The health tier's fault codes (gpuprov/data/health_codes.yaml): the table rendered into gpuprov-health is the
YAML's, the Xid rows agree with NVIDIA's catalog as gpuprov/smoke/xid.py transcribed it, and every code the program
can emit has an entry."""

from __future__ import annotations

import importlib.util
import re
from importlib import resources
from pathlib import Path

import pytest
import yaml

from gpuprov.core.errors import InputError
from gpuprov.health import codes
from gpuprov.smoke.xid import CATALOG

YAML = yaml.safe_load(resources.files("gpuprov.data").joinpath("health_codes.yaml").read_text())
GPUD_ACTIONS = ["REBOOT_SYSTEM", "HARDWARE_INSPECTION", "CHECK_USER_APP_AND_GPU", "RESET_GPU", "NONE"]
# NVIDIA's immediate action -> gpud's repair action and severity (the rule written in the YAML's header)
MAPPING = {"RESET_GPU": ("RESET_GPU", "fatal"), "RESTART_BM": ("REBOOT_SYSTEM", "fatal"),
           "RESTART_APP": ("CHECK_USER_APP_AND_GPU", "warn"), "IGNORE": ("NONE", "warn")}


def rendered_module(tmp_path: Path):
    path = codes.write_program(tmp_path / "gpuprov_health_rendered.py")
    spec = importlib.util.spec_from_file_location("gpuprov_health_rendered", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rendered_program_carries_exactly_the_yaml_table(tmp_path):
    keep = ("action", "severity", "text")
    expected = {
        "codes": {name: {k: v for k, v in entry.items() if k in keep} for name, entry in YAML["codes"].items()},
        "xids": {str(n): {k: v for k, v in entry.items() if k in keep} for n, entry in YAML["xids"].items()},
    }
    assert expected == rendered_module(tmp_path).CODES


def test_rendered_program_differs_from_the_source_only_in_the_table_line():
    source = Path(codes.__file__).with_name("check.py").read_text().splitlines()
    rendered = codes.render_program().splitlines()
    assert len(source) == len(rendered)
    changed = [(a, b) for a, b in zip(source, rendered, strict=True) if a != b]
    assert len(changed) == 1
    assert changed[0][0] == codes.MARKER and changed[0][1].startswith("CODES: dict = json.loads(")


def test_actions_are_gpuds_vocabulary():
    assert YAML["actions"] == GPUD_ACTIONS
    for entry in [*YAML["codes"].values(), *YAML["xids"].values()]:
        assert entry["action"] in GPUD_ACTIONS and entry["severity"] in ("fatal", "warn")


@pytest.mark.parametrize("number", sorted(YAML["xids"]))
def test_xid_rows_agree_with_nvidias_catalog(number):
    entry = YAML["xids"][number]
    mnemonic, _, immediate = CATALOG[number]
    assert (entry["mnemonic"], entry["nvidia_action"]) == (mnemonic, immediate)
    if immediate in MAPPING:
        assert (entry["action"], entry["severity"]) == MAPPING[immediate]
        assert entry["confirmed"] is True
    else:   # a WORKFLOW_* or XID_154 bucket: gpuprov's choice, said so
        assert entry["confirmed"] is False and entry["note"]


def test_unconfirmed_entries_say_why():
    for name, entry in [*YAML["codes"].items(), *YAML["xids"].items()]:
        assert entry["confirmed"] or entry.get("note"), name
        assert not entry["confirmed"] or entry.get("source") or name in YAML["xids"], name


def test_every_code_the_program_emits_has_an_entry():
    source = Path(codes.__file__).with_name("check.py").read_text()
    emitted = set(re.findall(r'fault\("([A-Z_]+)"', source))
    assert emitted == set(YAML["codes"]) - {"XID_UNKNOWN"}
    assert '"XID_UNKNOWN"' in source


def test_the_issue_s_codes_are_all_there():
    assert {"GPU_MISSING", "DRIVER_MISMATCH", "ECC_UNCORRECTABLE", "ROW_REMAP_PENDING", "ROW_REMAP_FAILED",
            "NVLINK_DOWN", "FABRIC_NOT_READY", "PCIE_DEGRADED", "PERSISTENCE_OFF"} <= set(YAML["codes"])
    assert {48, 63, 64, 74, 79, 94, 95, 119, 120} <= set(YAML["xids"])


@pytest.mark.parametrize(("entry", "message"), [
    ({"action": "REPLACE_GPU", "severity": "fatal", "confirmed": True}, "action 'REPLACE_GPU' is not one of"),
    ({"action": "NONE", "severity": "critical", "confirmed": True}, "severity 'critical' is not one of"),
    ({"action": "NONE", "severity": "warn", "confirmed": "yes"}, "confirmed must be true or false"),
    ("NONE", "expected a mapping"),
])
def test_bad_entries_are_refused(entry, message):
    with pytest.raises(InputError, match=message):
        codes._check_entry("X", entry, GPUD_ACTIONS)


def test_docs_table_lists_every_code_with_its_action():
    doc = (Path(__file__).parents[2] / "docs/health.md").read_text()
    for name, entry in YAML["codes"].items():
        assert f"| `{name}` | {entry['severity']} | `{entry['action']}` |" in doc, name
    for number, entry in YAML["xids"].items():
        assert f"| `XID_{number}` | {entry['severity']} | `{entry['action']}` |" in doc, number
