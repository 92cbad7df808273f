"""Lock files: round trip, header, drift, the newer-stack notice, key places."""

import pytest

from gpuprov.core.errors import InputError
from gpuprov.stack.data import OS_KEYS, table
from gpuprov.stack.lock import drift, load_lock, locate, newer_notice, package_key, write_lock
from gpuprov.stack.resolve import resolve


def test_round_trip_and_no_drift(tmp_path):
    stack = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570")
    path = write_lock(tmp_path / "locks" / "hgx.lock.yaml", stack, stack.inputs)
    text = path.read_text()
    assert text.startswith("# gpuprov stack lock") and "Review changes to this file like code" in text
    lock = load_lock(path)
    assert lock["stack"] == stack.to_dict() and lock["inputs"]["driver"] == "570"
    assert drift(lock, stack) == []


def test_every_resolvable_stack_survives_its_lock(tmp_path):
    """The lock validation accepts whatever the resolver writes: every GPU on every OS, with and without NVSwitch."""
    count = 0
    for gpu in table("gpus")["models"]:
        for os_key in OS_KEYS:
            for nvswitch in (False, True):
                try:
                    stack = resolve(gpu, os_key, nvswitch=nvswitch, gpus=8 if nvswitch else 1)
                except InputError:
                    continue
                path = write_lock(tmp_path / f"{gpu}-{os_key}-{nvswitch}.lock.yaml", stack, stack.inputs)
                assert load_lock(path)["stack"] == stack.to_dict()
                count += 1
    assert count > 20


def test_drift_names_each_change(tmp_path):
    old = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, driver="570")
    new = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, driver="580")
    lock = load_lock(write_lock(tmp_path / "a.lock.yaml", old, {}))
    changes = drift(lock, new)
    old_driver, new_fm = old.driver["packages"][0], new.fabricmanager["packages"][0]
    assert f"package {old_driver['name']}: lock {old_driver['version']} -> now absent" in changes
    assert any(c.startswith(f"package {new_fm['name']}: ") and c.endswith(f"-> now {new_fm['version']}")
               for c in changes)
    assert f"driver version: lock {old.driver['version']} -> now {new.driver['version']}" in changes
    old_fm = old.fabricmanager["version"]
    assert f"fabricmanager version: lock {old_fm} -> now {new.fabricmanager['version']}" in changes


def _stack(driver="570.148.08", cuda="12.8.1", nccl="2.26.2", ctk="1.17.8", dcgm="4.2.3") -> dict:
    part = {"packages": [{"name": "x", "version": "1"}]}
    return {"driver": {**part, "version": driver}, "cuda": {**part, "version": cuda},
            "nccl": {**part, "version": nccl}, "container_toolkit": {**part, "version": ctk},
            "dcgm": {**part, "version": dcgm}}


def test_newer_notice_names_each_newer_component_in_one_line():
    lock = {"lock_version": 1, "stack": _stack()}
    notice = newer_notice(lock, _stack(driver="575.57.08", nccl="2.27.3", dcgm="4.10.0"))
    assert notice == ("a newer stack exists: driver 570.148.08 -> 575.57.08, nccl 2.26.2 -> 2.27.3, "
                      "dcgm 4.2.3 -> 4.10.0; run with --update-lock to move the lock")


def test_newer_notice_none_when_nothing_is_newer():
    assert newer_notice({"stack": _stack()}, _stack()) is None
    # older is not newer; numeric, not text, comparison: 570.86 < 570.148
    assert newer_notice({"stack": _stack(driver="570.148.08")}, _stack(driver="570.86.15")) is None


def test_newer_notice_takes_a_resolved_stack_object(tmp_path):
    old = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570")
    lock = load_lock(write_lock(tmp_path / "hgx.lock.yaml", old, old.inputs))
    new = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="580")
    notice = newer_notice(lock, new)
    assert notice.startswith(f"a newer stack exists: driver {old.driver['version']} -> {new.driver['version']}")
    assert notice.endswith("run with --update-lock to move the lock")


def test_package_key_and_locate_name_the_place_of_a_package(tmp_path):
    stack = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570")
    path = write_lock(tmp_path / "gpu.lock.yaml", stack, {})
    lock = load_lock(path)
    key = package_key(lock, "libnccl-dev")
    assert key == "stack.nccl.packages[1].version"
    assert package_key(lock, "not-there") is None
    lines = path.read_text().splitlines()
    # the second "version:" line after "nccl:" is the libnccl-dev version
    start = lines.index("  nccl:")
    row = [i for i in range(start, len(lines)) if lines[i].strip().startswith("version:")][2]
    col = lines[row].index("version:") + len("version: ") + 1
    assert lines[row - 1].strip() == "- name: libnccl-dev"
    assert locate(path, key) == f"{path}:{row + 1}:{col}"


def test_locate_falls_back_to_the_nearest_key_or_the_file(tmp_path):
    path = tmp_path / "gpu.lock.yaml"
    path.write_text("lock_version: 1\nstack:\n  os: debian-12\n")
    assert locate(path, "stack.driver.packages[0].version") == f"{path}:3:3"
    assert locate(tmp_path / "missing.lock.yaml", "stack") == str(tmp_path / "missing.lock.yaml")


def test_missing_lock(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_lock(tmp_path / "nope.lock.yaml")
