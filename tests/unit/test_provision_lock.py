"""Provisioning keeps to the lock file that governs a host, and moves it only when told --update-lock."""

import pytest
import yaml

from gpuprov.core.errors import InputError
from gpuprov.inventory import Host
from gpuprov.provision.run import Options
from gpuprov.stack.host import stack_for
from gpuprov.stack.lock import load_lock, lock_path_for, write_lock
from gpuprov.stack.resolve import resolve_for_host

GPUS = [{"slot": f"0000:{i:02x}:00.0", "device_id": "2330", "description": "GH100", "model": "H100-SXM"}
        for i in range(8)]
FACTS = {"os": {"key": "ubuntu-22.04", "family": "debian"}, "pci_gpus": GPUS, "nvswitch_count": 4}


def host(driver: str | None = None) -> Host:
    stack = {"driver": driver} if driver else {}
    return Host(name="gpu01", address="10.0.0.1", groups=("hgx",),
                vars={"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True}, "stack": stack})


@pytest.fixture
def locked(tmp_path):
    """A group lock written from the host's inventory as it was (driver 570)."""
    path = tmp_path / "hgx.lock.yaml"
    write_lock(path, resolve_for_host(host("570").vars, "ubuntu-22.04", None), {"group": "hgx"})
    return path


def test_the_group_lock_governs_its_hosts(tmp_path, locked):
    assert lock_path_for(host(), tmp_path) == locked
    stack, used, notices = stack_for(host("570"), FACTS, Options(locks_dir=tmp_path))
    assert used == str(locked) and stack["driver"]["branch"] == "570" and notices == []


def test_a_different_resolution_installs_the_lock_and_says_so(tmp_path, locked):
    before = locked.read_text()
    stack, used, [notice] = stack_for(host("580"), FACTS, Options(locks_dir=tmp_path))
    assert stack["driver"]["branch"] == "570" and used == str(locked)
    assert "--update-lock" in notice and "580" in notice
    assert locked.read_text() == before


def test_a_lock_written_before_the_data_moved_on_is_reproduced(tmp_path, locked):
    """The lock holds an older point release than gpuprov's data resolves today: that release is installed."""
    doc = yaml.safe_load(locked.read_text())
    old = "570.86.15"  # an earlier R570 release (NVIDIA's R570 release notes)
    current = doc["stack"]["driver"]["version"]
    doc["stack"]["driver"]["version"] = old
    for pkg in doc["stack"]["driver"]["packages"]:
        pkg["version"] = pkg["version"].replace(current, old)
    locked.write_text(yaml.safe_dump(doc))
    stack, _, [notice] = stack_for(host("570"), FACTS, Options(locks_dir=tmp_path))
    assert stack["driver"]["version"] == old
    assert [p["version"].split("-")[0] for p in stack["driver"]["packages"]] == [old]
    assert current in notice


def test_a_lock_for_another_os_is_bad_input(tmp_path, locked):
    with pytest.raises(InputError, match="stack.os: the lock is for ubuntu-22.04, the host runs debian-12"):
        stack_for(host("570"), FACTS | {"os": {"key": "debian-12", "family": "debian"}}, Options(locks_dir=tmp_path))


def test_update_lock_moves_the_lock(tmp_path, locked):
    stack, _, [notice] = stack_for(host("580"), FACTS, Options(locks_dir=tmp_path, update_lock=True))
    assert stack["driver"]["branch"] == "580" and "moved the lock" in notice
    assert load_lock(locked)["stack"]["driver"]["branch"] == "580"
    assert load_lock(locked)["inputs"] == {"group": "hgx"}


def test_no_lock_means_the_resolved_stack(tmp_path):
    stack, used, _ = stack_for(host("580"), FACTS, Options(locks_dir=tmp_path))
    assert used is None and stack["driver"]["branch"] == "580"


def test_hosts_sharing_a_lock_move_it_once_and_must_agree(tmp_path, locked):
    options = Options(locks_dir=tmp_path, update_lock=True)
    stack_for(host("580"), FACTS, options)
    written = locked.read_text()
    stack, _, notices = stack_for(host("580"), FACTS, options)  # a second member of the group: same stack
    assert stack["driver"]["branch"] == "580" and notices == [] and locked.read_text() == written
    with pytest.raises(InputError, match="hosts sharing this lock resolve to different stacks"):
        stack_for(host("570"), FACTS, options)
    assert locked.read_text() == written


def test_a_dry_run_never_moves_the_lock(tmp_path, locked):
    before = locked.read_text()
    stack, _, [notice] = stack_for(host("580"), FACTS, Options(locks_dir=tmp_path, update_lock=True, dry_run=True))
    assert stack["driver"]["branch"] == "580" and "not written" in notice and locked.read_text() == before
