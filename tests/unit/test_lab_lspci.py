"""The lab's stand-in lspci prints what real `lspci` prints for the profile's devices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.lab import pci
from gpuprov.lab.profiles import load_profiles

# Real `lspci -nn` lines, byte-for-byte from /work/shared/fixtures/lspci/ (captures from
# leptonai/gpud pkg/nvidia-query/testdata/lspci.nn.a100 and lspci.nn.a10 at commit
# c93659b01d05b972d64ed7fd59edb8570a109e7b, Apache-2.0).
REAL_LINES = [
    "0001:00:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev a1)",
    "0005:00:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:1af1] (rev a1)",
    "06:00.0 3D controller [0302]: NVIDIA Corporation GA102GL [A10] [10de:2236] (rev a1)",
    "05:00.0 Ethernet controller [0200]: Mellanox Technologies ConnectX Family mlx5Gen Virtual Function [15b3:101e]",
    "00:1f.2 SATA controller [0106]: Intel Corporation 82801IR/IO/IH (ICH9R/DO/DH) 6 port SATA Controller "
    "[AHCI mode] [8086:2922] (rev 02)",
]
LSPCI_NN = re.compile(
    r"^(?P<slot>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (?P<class_name>[^\[\]]+?) "
    r"\[(?P<class>[0-9a-f]{4})\]: (?P<desc>.+) \[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]"
    r"(?: \(rev (?P<rev>[0-9a-f]{2})\))?$")
PROFILES = load_profiles()


@pytest.mark.parametrize("line", REAL_LINES)
def test_regex_parses_real_lspci_lines(line):
    assert LSPCI_NN.match(line)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_rendered_line_parses_like_a_real_one(name):
    profile = PROFILES[name]
    lines = pci.render(profile.devices, numeric=2).splitlines()
    assert len(lines) == len(profile.devices)
    parsed = [LSPCI_NN.match(line) for line in lines]
    assert all(parsed), lines
    gpus = [m for m in parsed if m["vendor"] == "10de" and m["class"].startswith("03")]
    assert len(gpus) == profile.hardware["count"]


def test_hgx_h100_lines_are_exactly_the_real_format():
    out = pci.render(PROFILES["hgx-h100"].devices, numeric=2, selector="10de:")
    lines = out.splitlines()
    assert "18:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)" in lines
    assert "07:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:22a3] (rev a1)" in lines
    assert len(lines) == 12 and out.endswith("\n")


GB200_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lspci" / "gb200-b200-x4_lspci.txt"
# HGX B200's GPU as `lspci -nn` prints it on HGX B200 servers (pci.ids "GB100 [B200]", 10de:2901), e.g. in
# NVIDIA GPU Operator confidential-computing instructions: "3D controller [0302]: NVIDIA Corporation GB100 [B200]
# [10de:2901] (rev a1)". The GB200 tray of the fixture has the other GB100 id, 2941.
B200_LINE = "3D controller [0302]: NVIDIA Corporation GB100 [B200] [10de:2901] (rev a1)"


def _after_slot(line: str) -> str:
    return line.split(" ", 1)[1]


def test_hgx_b200_shows_8_b200_and_the_nvswitch_bridge_as_real_lspci_does():
    profile = PROFILES["hgx-b200"]
    fixture = GB200_FIXTURE.read_text().splitlines()
    plain = pci.render(profile.devices, domains=True).splitlines()
    # the ConnectX-7 that carries NVSwitch management: the same words as in the captured Blackwell listing
    fixture_cx7 = {_after_slot(line) for line in fixture if "[ConnectX-7]" in line and "Infiniband" in line}
    assert fixture_cx7 == {"Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]"}
    ours_cx7 = [line for line in plain if "ConnectX-7" in line]
    assert len(ours_cx7) == 4 and {_after_slot(line) for line in ours_cx7} == fixture_cx7
    assert [line.split()[0] for line in ours_cx7] == [f"0000:06:00.{f}" for f in range(4)]
    # the GPUs: class, vendor and revision as the fixture's Blackwell GPUs print them, the B200 id and name
    fixture_gpu = {_after_slot(line) for line in fixture if "3D controller" in line}
    assert fixture_gpu == {"3D controller: NVIDIA Corporation Device 2941 (rev a1)"}
    numeric = pci.render(profile.devices, numeric=2, selector="10de:").splitlines()
    assert [_after_slot(line) for line in numeric] == [B200_LINE] * 8
    # 4th-generation NVSwitches are no PCI devices of the host: no NVIDIA bridge (0680), as in the fixture
    assert not any(" Bridge" in line and "NVIDIA" in line for line in fixture)
    assert pci.render(profile.devices, numeric=1, selector="10de::0680") == ""
    assert pci.render(profile.devices, numeric=1, selector="15b3:1021:0207").count("\n") == 4


def test_lines_are_sorted_by_slot_and_domain_flag_adds_0000():
    out = pci.render(PROFILES["l40s"].devices, numeric=2, domains=True).splitlines()
    slots = [line.split()[0] for line in out]
    assert slots == sorted(slots)
    assert all(s.startswith("0000:") for s in slots)


def test_plain_and_numeric_forms():
    dev = PROFILES["a100-pcie"].gpu_devices()[0]
    assert pci.render_line(dev) == "17:00.0 3D controller: NVIDIA Corporation GA100 [A100 PCIe 80GB] (rev a1)"
    assert pci.render_line(dev, numeric=1) == "17:00.0 0302: 10de:20b5 (rev a1)"


def test_rtx_4090_has_vga_class_and_audio_function():
    lines = pci.render(PROFILES["rtx-4090"].devices, numeric=2, selector="10de:").splitlines()
    assert lines[0] == ("01:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 4090] "
                        "[10de:2684] (rev a1)")
    assert lines[1].startswith("01:00.1 Audio device [0403]: NVIDIA Corporation AD102 High Definition Audio")


def test_selector_filters_vendor_device_and_class():
    devices = PROFILES["hgx-h100"].devices
    assert len(pci.render(devices, selector="10de:2330").splitlines()) == 8
    assert len(pci.render(devices, selector=":22a3").splitlines()) == 4
    assert len(pci.render(devices, selector="10de::0302").splitlines()) == 8
    assert "10de" not in pci.render(devices, numeric=1, selector="8086:")


@given(st.from_regex(r"[0-9a-f]{4}", fullmatch=True), st.from_regex(r"[0-9a-f]{4}", fullmatch=True))
def test_selector_matches_only_its_own_ids(vendor, device):
    dev = {"vendor": vendor, "device": device, "class": "0302"}
    assert pci.matches(dev, f"{vendor}:{device}")
    assert pci.matches(dev, f"{vendor.upper()}:")
    other = f"{(int(device, 16) + 1) % 0x10000:04x}"
    assert not pci.matches(dev, f"{vendor}:{other}")


@pytest.mark.parametrize("argv, expected", [
    (["-nn"], {"numeric": 2, "domains": False, "selector": None}),
    (["-Dnn", "-d", "10de:"], {"numeric": 2, "domains": True, "selector": "10de:"}),
    (["-n", "-d10de:2330"], {"numeric": 1, "domains": False, "selector": "10de:2330"}),
])
def test_parse_args(argv, expected):
    assert pci.parse_args(argv) == expected


@pytest.mark.parametrize("argv", [["-v"], ["-d"], ["extra"], ["-d", "10de"], ["-d", "1:2:3:4"]])
def test_bad_arguments_exit_2_with_a_message(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(pci, "DEVICES_FILE", str(tmp_path / "devices.json"))
    assert pci.main(argv) == 2
    assert capsys.readouterr().err.startswith("lspci: ")


def test_main_reads_the_hosts_devices_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(PROFILES["h200"].devices))
    monkeypatch.setattr(pci, "DEVICES_FILE", str(path))
    assert pci.main(["-nn", "-d", "10de:2335"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 8 and all("GH100 [H200 SXM 141GB] [10de:2335]" in line for line in out)


def test_missing_devices_file_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pci, "DEVICES_FILE", str(tmp_path / "absent.json"))
    assert pci.main(["-nn"]) == 1
    assert "cannot read" in capsys.readouterr().err
