"""Lock history: a write that replaces a lock with another stack keeps the old file in <locks>/history/, and
`rollout --to-lock` finds it (previous) or loads the lock it names before any host is touched."""

import os
import stat
import textwrap
from datetime import UTC, datetime

import pytest
import yaml
from helpers.tasks import config

import gpuprov.stack.lock as lock_module
from gpuprov.core.errors import InputError
from gpuprov.inventory import Host
from gpuprov.provision.run import Options
from gpuprov.stack.host import stack_for
from gpuprov.stack.lock import LockError, adopt_lock, load_lock, lock_history, lock_path_for, target_lock, write_lock
from gpuprov.tasks import stack as stack_tasks

# a lock as an operator keeps it: a comment of their own, no nscq/nvlsm sections (locked before they existed)
OLD = textwrap.dedent("""\
    # reviewed in change 1234
    lock_version: 1
    inputs:
      group: hgx
    stack:
      gpu:
        model: H100-SXM
        arch: hopper
        compute_capability: '9.0'
        datacenter: true
      os: ubuntu-22.04
      driver:
        branch: '570'
        version: 570.148.08
        kernel_modules: open
        packages:
        - name: nvidia-open-570
          version: 570.148.08-1ubuntu1
      cuda:
        version: 12.8.1
        packages:
        - name: cuda-toolkit-12-8
          version: 12.8.1-1
      forward_compat: false
      nccl:
        version: 2.26.5
        packages:
        - name: libnccl2
          version: 2.26.5-1+cuda12.9
      container_toolkit:
        version: 1.17.8
        packages:
        - name: nvidia-container-toolkit
          version: 1.17.8-1
      fabricmanager:
        version: 570.148.08
        packages:
        - name: nvidia-fabricmanager-570
          version: 570.148.08-1
      dcgm:
        version: 4.2.3
        packages:
        - name: datacenter-gpu-manager-4-core
          version: 1:4.2.3-1
      ngc_pytorch: 25.04-py3
      pytorch:
        version: '2.7'
        wheel: cu128
    """)
NEW = OLD.replace("570.148.08", "580.65.06").replace("'570'", "'580'").replace("-570", "-580")
STAMP = datetime(2026, 12, 3, 7, 14, 44, tzinfo=UTC)


def stack_of(text: str) -> dict:
    return yaml.safe_load(text)["stack"]


@pytest.fixture
def locks(tmp_path, monkeypatch):
    """A locks folder holding hgx.lock.yaml as OLD (mode 0640), with the clock stopped at STAMP."""
    monkeypatch.setattr(lock_module, "_now", lambda: STAMP)
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "hgx.lock.yaml").write_text(OLD)
    os.chmod(folder / "hgx.lock.yaml", 0o640)
    return folder


def names(folder) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_new_stack_keeps_the_replaced_lock_byte_for_byte(locks):
    write_lock(locks / "hgx.lock.yaml", stack_of(NEW), {"group": "hgx"})
    kept = locks / "history" / "hgx.20261203T071444Z.lock.yaml"
    assert names(locks / "history") == ["hgx.20261203T071444Z.lock.yaml"]
    assert kept.read_text() == OLD
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert load_lock(locks / "hgx.lock.yaml")["stack"]["driver"]["version"] == "580.65.06"
    assert lock_history(locks / "hgx.lock.yaml") == [kept]


def test_the_same_stack_keeps_nothing(locks):
    """New inputs, and nscq/nvlsm written as null where the old lock lacks them: the same stack."""
    write_lock(locks / "hgx.lock.yaml", stack_of(OLD) | {"nscq": None, "nvlsm": None}, {"group": "hgx", "x": 1})
    assert not (locks / "history").exists()
    assert lock_history(locks / "hgx.lock.yaml") == []
    assert load_lock(locks / "hgx.lock.yaml")["inputs"] == {"group": "hgx", "x": 1}


def test_a_first_write_keeps_nothing(tmp_path):
    write_lock(tmp_path / "gpu01.lock.yaml", stack_of(NEW), {})
    assert names(tmp_path) == ["gpu01.lock.yaml"]


def test_kept_names_that_clash_get_a_number_and_nothing_is_overwritten(locks):
    (locks / "history").mkdir()
    (locks / "history" / "hgx.20261203T071444Z.lock.yaml").write_text("taken\n")
    write_lock(locks / "hgx.lock.yaml", stack_of(NEW), {})
    write_lock(locks / "hgx.lock.yaml", stack_of(OLD), {})
    assert names(locks / "history") == ["hgx.20261203T071444Z.1.lock.yaml", "hgx.20261203T071444Z.2.lock.yaml",
                                        "hgx.20261203T071444Z.lock.yaml"]
    assert (locks / "history" / "hgx.20261203T071444Z.lock.yaml").read_text() == "taken\n"
    assert (locks / "history" / "hgx.20261203T071444Z.1.lock.yaml").read_text() == OLD
    assert stack_of((locks / "history" / "hgx.20261203T071444Z.2.lock.yaml").read_text()) == stack_of(NEW)


def test_history_is_newest_first_by_the_name_not_the_modification_time(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    written = ["hgx.20261203T071444Z.10.lock.yaml", "hgx.20251231T235959Z.lock.yaml", "hgx.20261203T071444Z.lock.yaml",
               "hgx.20261203T071444Z.2.lock.yaml", "hgx.20260101T000000Z.lock.yaml",
               # not hgx's: another lock's, a name without a stamp, a folder
               "hgx-b.20270101T000000Z.lock.yaml", "hgx.latest.lock.yaml", "gpu01.20270101T000000Z.lock.yaml"]
    for age, name in enumerate(written):
        (history / name).write_text(OLD)
        os.utime(history / name, (1_000_000 + age, 1_000_000 + age))  # the later written, the newer mtime
    (history / "hgx.20270101T000000Z.lock.yaml").mkdir()
    assert [path.name for path in lock_history(tmp_path / "hgx.lock.yaml")] == [
        "hgx.20261203T071444Z.10.lock.yaml", "hgx.20261203T071444Z.2.lock.yaml", "hgx.20261203T071444Z.lock.yaml",
        "hgx.20260101T000000Z.lock.yaml", "hgx.20251231T235959Z.lock.yaml"]


def test_previous_is_the_newest_kept_version(locks):
    (locks / "history").mkdir()
    (locks / "history" / "hgx.20250101T000000Z.lock.yaml").write_text(NEW)
    write_lock(locks / "hgx.lock.yaml", stack_of(NEW), {})
    previous = target_lock("previous", locks / "hgx.lock.yaml", locks)
    assert previous == locks / "history" / "hgx.20261203T071444Z.lock.yaml"


def test_previous_without_history_says_where_history_starts(locks):
    with pytest.raises(InputError, match="has no earlier version") as caught:
        target_lock("previous", locks / "hgx.lock.yaml", locks)
    assert caught.value.exit_code == 2
    assert "history starts with the first --update-lock" in caught.value.hint


def test_previous_without_a_governing_lock_is_bad_input(locks):
    with pytest.raises(InputError, match="no lock in .* governs these hosts"):
        target_lock("previous", None, locks)


def test_a_lock_path_is_taken_from_the_current_folder(locks, monkeypatch):
    monkeypatch.chdir(locks.parent)
    (locks.parent / "old.lock.yaml").write_text(OLD)
    assert target_lock("old.lock.yaml", locks / "hgx.lock.yaml", locks) == locks.parent / "old.lock.yaml"


def test_a_corrupt_to_lock_file_is_a_located_error(locks, monkeypatch):
    monkeypatch.chdir(locks.parent)
    (locks.parent / "old.lock.yaml").write_text(OLD.replace("lock_version: 1", "lock_version: 2"))
    with pytest.raises(LockError) as caught:
        target_lock("old.lock.yaml", locks / "hgx.lock.yaml", locks)
    assert caught.value.exit_code == 2
    assert caught.value.errors == ["old.lock.yaml:2:15: lock_version: this gpuprov reads lock_version 1, not 2"]


def test_a_corrupt_previous_lock_is_a_located_error(locks):
    (locks / "history").mkdir()
    kept = locks / "history" / "hgx.20250101T000000Z.lock.yaml"
    kept.write_text(OLD.replace("version: 12.8.1\n", "version: twelve\n"))
    with pytest.raises(LockError) as caught:
        target_lock("previous", locks / "hgx.lock.yaml", locks)
    assert caught.value.errors == [f"{kept}:20:14: stack.cuda.version: bad version 'twelve': expected digits and "
                                   'dots like "570.148.08"']


def test_a_missing_to_lock_file_is_bad_input(locks, monkeypatch):
    monkeypatch.chdir(locks.parent)
    with pytest.raises(InputError, match="lock file nope.lock.yaml does not exist"):
        target_lock("nope.lock.yaml", locks / "hgx.lock.yaml", locks)


def test_adopting_a_lock_twice_writes_once(locks):
    source = locks.parent / "new.lock.yaml"
    source.write_text(NEW)
    governing = locks / "hgx.lock.yaml"
    assert adopt_lock(source, governing) is True
    assert load_lock(governing)["stack"]["driver"]["version"] == "580.65.06"
    assert names(locks / "history") == ["hgx.20261203T071444Z.lock.yaml"]
    assert (locks / "history" / "hgx.20261203T071444Z.lock.yaml").read_text() == OLD
    after = governing.read_bytes()
    assert adopt_lock(source, governing) is False
    assert governing.read_bytes() == after
    assert names(locks / "history") == ["hgx.20261203T071444Z.lock.yaml"]


def test_adopting_the_same_stack_in_other_bytes_writes_nothing(locks):
    source = locks.parent / "same.lock.yaml"
    source.write_text("# another comment\n" + OLD.replace("inputs:\n  group: hgx\n", ""))
    assert adopt_lock(source, locks / "hgx.lock.yaml") is False
    assert (locks / "hgx.lock.yaml").read_text() == OLD


def test_rolling_back_to_previous_restores_the_old_stack(locks):
    write_lock(locks / "hgx.lock.yaml", stack_of(NEW), {"group": "hgx"})
    assert adopt_lock(target_lock("previous", locks / "hgx.lock.yaml", locks), locks / "hgx.lock.yaml") is True
    assert load_lock(locks / "hgx.lock.yaml")["stack"]["driver"]["version"] == "570.148.08"
    assert names(locks / "history") == ["hgx.20261203T071444Z.1.lock.yaml", "hgx.20261203T071444Z.lock.yaml"]
    assert load_lock(locks / "history" / "hgx.20261203T071444Z.1.lock.yaml")["stack"]["driver"]["version"] == (
        "580.65.06")


def test_history_files_never_govern_a_host(locks):
    host = Host(name="gpu01", address="10.0.0.1", groups=("hgx",), vars={})
    (locks / "hgx.lock.yaml").unlink()
    (locks / "history").mkdir()
    for name in ("gpu01.20261203T071444Z.lock.yaml", "hgx.20261203T071444Z.lock.yaml", "gpu01.lock.yaml",
                 "hgx.lock.yaml"):
        (locks / "history" / name).write_text(OLD)
    assert lock_path_for(host, locks) is None
    (locks / "hgx.lock.yaml").write_text(OLD)
    assert lock_path_for(host, locks) == locks / "hgx.lock.yaml"


def test_update_lock_keeps_the_replaced_lock(locks):
    """provision --update-lock (stack_for -> _move_lock) moves a 570 lock to the inventory's 580."""
    host = Host(name="gpu01", address="10.0.0.1", groups=("hgx",),
                vars={"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True}, "stack": {"driver": "580"}})
    gpus = [{"slot": f"0000:{i:02x}:00.0", "device_id": "2330", "description": "GH100", "model": "H100-SXM"}
            for i in range(8)]
    facts = {"os": {"key": "ubuntu-22.04", "family": "debian"}, "pci_gpus": gpus, "nvswitch_count": 4}
    stack, used, [notice] = stack_for(host, facts, Options(locks_dir=locks, update_lock=True))
    assert stack["driver"]["branch"] == "580" and used == str(locks / "hgx.lock.yaml")
    assert f"kept in {locks / 'history'}" in notice
    assert names(locks / "history") == ["hgx.20261203T071444Z.lock.yaml"]
    assert (locks / "history" / "hgx.20261203T071444Z.lock.yaml").read_text() == OLD


def test_stack_lock_keeps_the_lock_it_replaces_once(locks, capsys):
    """stack.lock --group hgx resolves R570 from the inventory (tests/unit/helpers/tasks.py) over a 580 lock."""
    (locks / "hgx.lock.yaml").write_text(NEW)
    ctx = config(locks.parent, locks=locks)
    stack_tasks.lock(ctx, group=["hgx"], os="ubuntu-22.04")
    kept = locks / "history" / "hgx.20261203T071444Z.lock.yaml"
    assert f"kept the lock it replaced as {kept}" in capsys.readouterr().err
    assert kept.read_text() == NEW and load_lock(locks / "hgx.lock.yaml")["stack"]["driver"]["branch"] == "570"
    stack_tasks.lock(ctx, group=["hgx"], os="ubuntu-22.04")
    assert "kept" not in capsys.readouterr().err
    assert names(locks / "history") == ["hgx.20261203T071444Z.lock.yaml"]


def test_a_dry_run_update_keeps_no_history(locks):
    host = Host(name="gpu01", address="10.0.0.1", groups=("hgx",),
                vars={"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True}, "stack": {"driver": "580"}})
    facts = {"os": {"key": "ubuntu-22.04", "family": "debian"}, "pci_gpus": [], "nvswitch_count": 4}
    stack_for(host, facts, Options(locks_dir=locks, update_lock=True, dry_run=True))
    assert not (locks / "history").exists() and (locks / "hgx.lock.yaml").read_text() == OLD


def test_a_history_path_that_is_a_file_refuses_the_write(locks):
    (locks / "history").write_text("not a folder\n")
    with pytest.raises(InputError, match="cannot keep the previous lock there"):
        write_lock(locks / "hgx.lock.yaml", stack_of(NEW), {})
    assert (locks / "hgx.lock.yaml").read_text() == OLD
    assert names(locks) == ["hgx.lock.yaml", "history"]  # no temp file left behind


def test_the_longest_lock_name_keeps_history_under_the_file_name_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "_now", lambda: STAMP)
    name = "a" * 245  # the longest host name with a lock file (NAME_MAX 255 less .lock.yaml)
    path = tmp_path / f"{name}.lock.yaml"
    path.write_text(OLD)
    write_lock(path, stack_of(NEW), {})
    [kept] = lock_history(path)
    assert kept.read_text() == OLD and len(kept.name) <= 255
    assert kept.name.startswith("a" * 200) and "~" in kept.name and kept.name.endswith(".20261203T071444Z.lock.yaml")
    assert lock_history(tmp_path / f"{'a' * 244}b.lock.yaml") == []
