"""One way to name hosts: every host task takes --host/--group/--all/--inventory/--parallel/--trust-new-hosts,
and bad selections exit 2 before any host is touched (the inventory's hosts are unreachable TEST-NET addresses).
stack.lock --os resolves from the inventory alone, so its lock files are checked here too."""

from __future__ import annotations

import pytest
from helpers.tasks import INVENTORY, exit_code, invoke, locks
from invoke import Config, Context

from gpuprov.stack.lock import load_lock
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import harden as harden_tasks
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks

HOST_TASKS = {
    "facts": facts_tasks.facts,
    "harden": harden_tasks.harden,
    "preflight": provision_tasks.preflight,
    "provision": provision_tasks.provision,
    "stack.check": stack_tasks.check,
    "stack.lock": stack_tasks.lock,
}


@pytest.fixture
def ctx(tmp_path) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "locks": str(tmp_path / "locks"), "reports": str(tmp_path / "reports"),
        "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout": 1, "connect_retries": 0}}))


@pytest.mark.parametrize("name", HOST_TASKS)
@pytest.mark.parametrize("selection", [{"all": True, "host": ["gpu01"]}, {"all": True, "group": ["hgx"]}])
def test_all_with_host_or_group_is_bad_input(ctx, capsys, name, selection):
    code, err = exit_code(HOST_TASKS[name], ctx, capsys, **selection)
    assert code == 2 and "--all selects every host" in err


@pytest.mark.parametrize("name", HOST_TASKS)
@pytest.mark.parametrize(("selection", "message"), [
    ({"host": ["gpu1"]}, "unknown host 'gpu1'"),
    ({"group": ["hxg"]}, "unknown group 'hxg' (did you mean 'hgx'?)"),
    ({}, "no hosts selected"),
])
def test_unknown_names_and_no_selection_are_bad_input(ctx, capsys, name, selection, message):
    code, err = exit_code(HOST_TASKS[name], ctx, capsys, **selection)
    assert code == 2 and message in err


@pytest.mark.parametrize("name", HOST_TASKS)
@pytest.mark.parametrize("parallel", ["0", "many", "-3"])
def test_bad_parallel_is_bad_input(ctx, capsys, name, parallel):
    code, err = exit_code(HOST_TASKS[name], ctx, capsys, host=["gpu01"], parallel=parallel)
    assert code == 2 and "--parallel must be a whole number >= 1" in err


@pytest.mark.parametrize("name", HOST_TASKS)
def test_a_missing_inventory_is_bad_input(ctx, capsys, tmp_path, name):
    code, err = exit_code(HOST_TASKS[name], ctx, capsys, host=["gpu01"], inventory=str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml not found" in err


def test_lock_per_group_holds_the_groups_stack(ctx, tmp_path, capsys):
    stack_tasks.lock(ctx, group=["hgx"], os="ubuntu-22.04")
    assert locks(tmp_path) == ["hgx.lock.yaml"]
    lock = load_lock(tmp_path / "locks" / "hgx.lock.yaml")
    assert lock["stack"]["gpu"]["model"] == "H100-SXM" and lock["stack"]["driver"]["branch"] == "570"
    assert lock["stack"]["fabricmanager"] is not None and lock["stack"]["os"] == "ubuntu-22.04"
    assert f"wrote {tmp_path / 'locks' / 'hgx.lock.yaml'}" in capsys.readouterr().out


def test_lock_per_host_and_per_group_together(ctx, tmp_path):
    stack_tasks.lock(ctx, group=["hgx"], host=["gpu03"], os="debian-12")
    assert locks(tmp_path) == ["gpu03.lock.yaml", "hgx.lock.yaml"]
    assert load_lock(tmp_path / "locks" / "gpu03.lock.yaml")["stack"]["gpu"]["model"] == "L40S"


def test_lock_all_writes_one_lock_per_host(ctx, tmp_path):
    stack_tasks.lock(ctx, all=True, os="debian-12")
    assert locks(tmp_path) == ["gpu01.lock.yaml", "gpu02.lock.yaml", "gpu03.lock.yaml"]


def test_lock_of_a_group_whose_hosts_differ_writes_nothing(ctx, tmp_path, capsys):
    code, err = exit_code(stack_tasks.lock, ctx, capsys, group=["hgx", "fleet"], os="debian-12")
    assert code == 2 and "hosts of fleet resolve to different stacks (gpu01, gpu02, gpu03)" in err
    assert locks(tmp_path) == []


def test_lock_with_an_unknown_os_is_bad_input(ctx, capsys):
    code, err = exit_code(stack_tasks.lock, ctx, capsys, group=["hgx"], os="ubuntu-18.04")
    assert code == 2 and "unknown OS 'ubuntu-18.04'" in err


def test_lock_refuses_a_name_that_is_both_group_and_host(tmp_path, capsys):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY + "  ada: {address: 192.0.2.14, groups: [ada]}\n")
    c = Context(Config(overrides={"gpuprov": {"locks": str(tmp_path / "locks")}}))
    code, err = exit_code(stack_tasks.lock, c, capsys, group=["ada"], host=["ada"], os="debian-12",
                          inventory=str(inventory))
    assert code == 2 and "ada names both a group and a host" in err
    assert locks(tmp_path) == []


def test_check_refuses_a_corrupt_lock_before_touching_hosts(ctx, tmp_path, capsys):
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "hgx.lock.yaml").write_text("lock_version: 1\nstack:\n  os: [debian-12]\n")
    code, err = exit_code(stack_tasks.check, ctx, capsys, group=["hgx"])
    assert code == 2
    assert f"{folder / 'hgx.lock.yaml'}:3:3: stack.driver: missing" in err
    assert f"{folder / 'hgx.lock.yaml'}:3:7: stack.os: must be one of" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", HOST_TASKS)
def test_every_host_task_lists_the_shared_options(name, tmp_path):
    proc = invoke("--help", name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for option in ("--host", "--group", "--all", "--inventory", "--parallel", "--trust-new-hosts"):
        assert option in proc.stdout


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    proc = invoke("stack.check", "--all", "--host", "gpu01", "--inventory", str(inventory), cwd=tmp_path)
    assert proc.returncode == 2 and "--all selects every host" in proc.stderr and "Traceback" not in proc.stderr
    proc = invoke("facts", "--host", "gpu01,gpu9", "--inventory", str(inventory), cwd=tmp_path)
    assert proc.returncode == 2 and "unknown host 'gpu9'" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("provision", "--hots", "a"), "error: provision: unknown option '--hots' (did you mean --host?); "
                                   "see: inv[oke] --help provision\n"),
    (("stack.resolve", "--gpu", "H100", "--os", "ubuntu2204", "--gpus"),
     "error: stack.resolve: --gpus needs a value; see: inv[oke] --help stack.resolve\n"),
])
def test_the_plain_invoke_binary_refuses_a_bad_task_argument_with_exit_2(tmp_path, args, message):
    proc = invoke(*args, cwd=tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, message, "")
