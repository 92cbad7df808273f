"""Lock files: round trip, header, drift, bad files."""

import pytest

from gpuprov.errors import InputError
from gpuprov.stack.lock import drift, load_lock, write_lock
from gpuprov.stack.resolve import resolve


def test_round_trip_and_no_drift(tmp_path):
    stack = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570")
    path = write_lock(tmp_path / "locks" / "hgx.lock.yaml", stack, stack.inputs)
    text = path.read_text()
    assert text.startswith("# gpuprov stack lock") and "Review changes to this file like code" in text
    lock = load_lock(path)
    assert lock["stack"] == stack.to_dict() and lock["inputs"]["driver"] == "570"
    assert drift(lock, stack) == []


def test_drift_names_each_change(tmp_path):
    old = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, driver="570")
    new = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, driver="580")
    lock = load_lock(write_lock(tmp_path / "a.lock.yaml", old, {}))
    changes = drift(lock, new)
    assert any(c.startswith("package nvidia-open-570") for c in changes)
    assert any(c.startswith("package nvidia-fabricmanager-580") for c in changes)
    assert any(c.startswith("driver version") for c in changes)


@pytest.mark.parametrize("content", ["a: [", "just text", "lock_version: 9\nstack: {}\n",
                                     "lock_version: 1\nstack: {os: x}\n"])
def test_bad_lock_files(tmp_path, content):
    path = tmp_path / "bad.lock.yaml"
    path.write_text(content)
    with pytest.raises(InputError) as exc:
        load_lock(path)
    assert exc.value.exit_code == 2
    assert path.read_text() == content


def test_missing_lock(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_lock(tmp_path / "nope.lock.yaml")
