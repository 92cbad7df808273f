"""Lab hardware profiles: loading, validation, assignment to hosts."""

from __future__ import annotations

import copy

import pytest

from gpuprov.core.errors import InputError
from gpuprov.lab.profiles import assign_profiles, load_document, load_profiles, parse_profiles

EXPECTED = {
    "hgx-h100": ({"gpu": "H100-SXM", "count": 8, "nvswitch": True}, "2330", 4),
    "h200": ({"gpu": "H200", "count": 8, "nvswitch": True}, "2335", 4),
    "a100-pcie": ({"gpu": "A100-PCIE-80GB", "count": 2, "nvswitch": False}, "20b5", 0),
    "l40s": ({"gpu": "L40S", "count": 4, "nvswitch": False}, "26b9", 0),
    "rtx-4090": ({"gpu": "RTX-4090", "count": 2, "nvswitch": False}, "2684", 0),
    # B200's NVSwitches are behind a ConnectX-7 bridge, not 10de:22a3 devices (see test_lab_lspci)
    "hgx-b200": ({"gpu": "B200", "count": 8, "nvswitch": True}, "2901", 0),
}
WITH_DOCKER = {"hgx-h100", "h200", "hgx-b200"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_hardware_and_devices(name):
    hardware, device_id, switches = EXPECTED[name]
    profile = load_profiles()[name]
    assert profile.hardware == hardware
    assert {d["device"] for d in profile.gpu_devices()} == {device_id}
    assert sum(d["device"] == "22a3" for d in profile.devices) == switches
    assert any(d["vendor"] != "10de" for d in profile.devices)


def test_assign_cycles_the_given_profiles():
    names = [p.name for p in assign_profiles(5, ["hgx-h100", "l40s"])]
    assert names == ["hgx-h100", "l40s", "hgx-h100", "l40s", "hgx-h100"]


def test_assign_defaults_to_the_mix():
    names = [p.name for p in assign_profiles(6, None)]
    assert set(names) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hgx_profiles_ask_for_docker(name):
    assert load_profiles()[name].vars == ({"container_engine": "docker"} if name in WITH_DOCKER else {})


def test_the_b200_profile_resolves_a_stack_with_fabric_manager():
    from gpuprov.stack.resolve import resolve

    hardware = load_profiles()["hgx-b200"].hardware
    stack = resolve(hardware["gpu"], "debian-12", gpus=hardware["count"], nvswitch=hardware["nvswitch"]).to_dict()
    assert stack["gpu"]["model"] == "B200" and stack["driver"]["kernel_modules"] == "open"
    assert stack["fabricmanager"] is not None


def test_the_mig_profile_is_the_captured_mig_host():
    # tests/fixtures/nvidia-smi-table/h100-sxm5-80gb-mig-enabled_nvidia-smi_590.48.01_load.txt: one H100 SXM5 80GB at
    # 00:09.0 with MIG devices of 60, 32, 16 and 16 SMs (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb on H100 80GB)
    profile = load_profiles()["h100-mig"]
    assert profile.hardware == {"gpu": "H100-SXM", "count": 1, "nvswitch": False}
    assert [d["slot"] for d in profile.gpu_devices()] == ["0000:00:09.0"]
    assert profile.mig == ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
    assert "h100-mig" not in load_document()["default_mix"]
    assert all(not p.mig for name, p in load_profiles().items() if name != "h100-mig")


def test_unknown_profile_is_bad_input():
    with pytest.raises(InputError) as err:
        assign_profiles(2, ["hgx-h100", "b300"])
    assert err.value.exit_code == 2 and "b300" in str(err.value) and "hgx-h100" in str(err.value)


def test_zero_hosts_is_bad_input():
    with pytest.raises(InputError):
        assign_profiles(0, None)


def _doc():
    return copy.deepcopy(load_document())


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d["profiles"]["l40s"]["hardware"].update(count=3), "hardware.count"),
    (lambda d: d["profiles"]["l40s"]["hardware"].pop("nvswitch"), "exactly gpu, count, nvswitch"),
    (lambda d: d["profiles"]["hgx-h100"]["hardware"].update(nvswitch=False), "nvswitch"),
    (lambda d: d["profiles"]["l40s"]["gpu"].update(device="26b"), "4 hex digits"),
    (lambda d: d["profiles"]["l40s"]["gpu"]["slots"].__setitem__(0, "zz:00.0"), "bad PCI slot"),
    (lambda d: d["profiles"]["l40s"]["gpu"]["slots"].__setitem__(1, "1b:00.0"), "used twice"),
    (lambda d: d["profiles"]["l40s"]["gpu"].update({"class": "0999"}), "no name"),
    (lambda d: d["default_mix"].append("nope"), "unknown profile"),
    (lambda d: d["profiles"]["l40s"].update(vars={"container_engine": "podman"}), "not allowed"),
    (lambda d: d["profiles"]["l40s"].update(vars={"stack": {"driver": "570"}}), "not allowed"),
    (lambda d: d["profiles"]["l40s"].update(vars=["docker"]), "must be a mapping"),
    (lambda d: d["profiles"]["hgx-b200"]["nvswitch"].update(vendor="abcd"), "no name"),
    (lambda d: d["profiles"]["h100-mig"].update(mig=["5g.50gb"]), "unknown H100-SXM MIG profile"),
    (lambda d: d["profiles"]["h100-mig"].update(mig="1g.10gb"), "non-empty list"),
    # MIG user guide, H100 80GB: 7 compute slices, 8 memory slices (3g.40gb takes 4 of them)
    (lambda d: d["profiles"]["h100-mig"].update(mig=["3g.40gb", "3g.40gb", "2g.20gb"]), "take 8 compute slices"),
    (lambda d: d["profiles"]["h100-mig"].update(mig=["3g.40gb", "3g.40gb", "1g.10gb"]), "take 9 memory slices"),
    (lambda d: d["profiles"]["l40s"].update(mig=["1g.10gb"]), "has no MIG profiles"),
])
def test_broken_profiles_are_refused(breakage, message):
    doc = _doc()
    breakage(doc)
    with pytest.raises(InputError, match=message):
        parse_profiles(doc)
