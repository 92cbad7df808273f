"""Tests of the shared op machinery (facts in, commands out); the builders the ops tests share are in helpers/ops.py."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from helpers.ops import CA_PEM, bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.operations import managed_file, parse_versionlock, unified_diff, write_file
from gpuprov.core.packages import for_family
from gpuprov.provision.ops import COMPONENTS, plan_changes


def tokens(change_or_commands) -> list[list[str]]:
    commands = getattr(change_or_commands, "commands", change_or_commands)
    return [shlex.split(command) for command in commands]


def all_commands(changes) -> list[str]:
    return [command for change in changes for command in change.commands]


# --- the shared machinery ---------------------------------------------------------------------------------

def test_write_file_is_atomic_and_keeps_metacharacters_literal(tmp_path):
    target = tmp_path / "etc" / "conf"
    marker = tmp_path / "pwned"
    content = f"a $(touch {marker}) `touch {marker}`;reboot 'quote' \"dq\" %s %d \\n back\\slash\n-dash\n"
    subprocess.run(["sh", "-c", write_file(str(target), content, "0600")], check=True)
    assert target.read_text() == content
    assert not marker.exists()
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert not (tmp_path / "etc" / "conf.gpuprov.tmp").exists()


def test_a_file_the_validator_rejects_never_replaces_the_old_one(tmp_path):
    """The validator runs on the staged file before the rename; paths with shell metacharacters stay one word."""
    target = tmp_path / "it's $(here)" / "conf"
    target.parent.mkdir()
    target.write_text("ok old\n")

    def apply(content: str) -> subprocess.CompletedProcess:
        change = managed_file("test", str(target), target.read_text(), content, "test",
                              validate="grep -q '^ok' %s", rejected="grep said no", then=("echo reloaded",))
        return subprocess.run(["sh", "-ec", "\n".join(change.commands)], capture_output=True, text=True)

    refused = apply("bad\n")
    assert refused.returncode == 1 and refused.stderr.startswith("grep said no: ")
    assert "reloaded" not in refused.stdout
    assert target.read_text() == "ok old\n" and sorted(p.name for p in target.parent.iterdir()) == ["conf"]
    accepted = apply("ok new\n")
    assert accepted.returncode == 0 and accepted.stdout == "reloaded\n"
    assert target.read_text() == "ok new\n" and sorted(p.name for p in target.parent.iterdir()) == ["conf"]


def test_unified_diff_names_created_and_removed_files():
    assert unified_diff("/etc/x", None, "a\n").startswith("--- /dev/null\n+++ /etc/x\n")
    assert "+++ /dev/null" in unified_diff("/etc/x", "a\n", None)
    assert unified_diff("/etc/x", "a\n", "a\n") == ""


def test_parse_versionlock_reads_epochs_and_wildcards_and_skips_exclusions():
    text = ("# comment\nnvidia-driver-3:570.148.08-1.el9.*\nlibnccl-0:2.26.5-1+cuda12.9.x86_64\n"
            "!cuda-compat-12-8-0:1-1.*\n")
    assert parse_versionlock(text) == {"nvidia-driver": {"570.148.08-1.el9"}, "libnccl": {"2.26.5-1+cuda12.9"}}


SECRET_REPO = {"url": "https://bob:s3cret@mirror.internal/nvidia/", "proxy": "http://px:pxpass@proxy.internal:3128",
               "ca_pem": CA_PEM}


@pytest.mark.parametrize("family", ["debian", "rhel"])
@pytest.mark.parametrize("repo", [{}, {"proxy": "http://proxy.internal:3128", "ca_pem": CA_PEM}, SECRET_REPO])
def test_second_run_changes_nothing(family, repo):
    repo = make_repo(**repo)
    for stack in (make_stack(family), make_stack(family, nvswitch=True, forward_compat=True),
                  make_stack(family, nvswitch=True, fourth_gen=True)):
        facts = provisioned_facts(family, stack, repo)
        assert plan_changes(ctx_for(facts, stack, repo)) == []


@pytest.mark.parametrize("family", ["debian", "rhel"])
def test_bare_host_plan_covers_every_component_in_order_and_refreshes_the_index_once(family):
    stack = make_stack(family, nvswitch=True)
    changes = plan_changes(ctx_for(bare_facts(family), stack, host_vars={"container_engine": "docker"}))
    order = [c.component for c in changes]
    assert sorted(set(order), key=order.index) == [c for c in COMPONENTS if c in order]
    assert set(order) == set(COMPONENTS)
    refresh = for_family(family).update()
    assert all_commands(changes).count(refresh) == 1
    assert any(c.reboot for c in changes if c.component == "driver")


def test_plan_only_selects_components_and_still_refreshes_before_installing():
    changes = plan_changes(ctx_for(bare_facts()), only={"nccl"})
    assert [c.component for c in changes] == ["nccl"]
    assert changes[0].commands[0] == for_family("debian").update()


def test_plan_rejects_unknown_components():
    with pytest.raises(InputError, match="unknown component"):
        plan_changes(ctx_for(bare_facts()), only={"drivers"})


def test_plan_refuses_unsupported_os_family():
    facts = bare_facts()
    facts["os"]["family"] = None
    with pytest.raises(GpuprovError, match="unsupported operating system") as info:
        plan_changes(ctx_for(facts, make_stack()))
    assert info.value.host == "gpu01"


def test_every_command_of_a_bare_plan_is_valid_shell():
    for family in ("debian", "rhel"):
        for change in plan_changes(ctx_for(bare_facts(family), make_stack(family, nvswitch=True))):
            tokens(change)
            assert change.summary and "\n" not in change.summary
