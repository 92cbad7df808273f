"""Plan, batch apply and preflight: pure pieces, and the batch script run for real by a local shell."""

import subprocess

import pytest
from helpers.ops import bare_facts, make_repo, make_stack

from gpuprov.core.apply import batch_script, parse_steps
from gpuprov.core.errors import GpuprovError, InputError, mask_credentials
from gpuprov.core.executor import failure_budget
from gpuprov.provision.ops import Change
from gpuprov.provision.plan import prepare_changes
from gpuprov.provision.preflight import evaluate, parse_probe, probe_command


def run_locally(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_batch_runs_every_step_and_reports_each():
    changes = [Change("a", "first", ("echo one", "echo two")), Change("b", "second", ("echo three",))]
    proc = run_locally(batch_script(changes))
    assert proc.returncode == 0
    steps = parse_steps(changes, proc.stdout)
    assert [(s.component, s.rc) for s in steps] == [("a", 0), ("b", 0)]
    assert steps[0].output == "one\ntwo" and steps[1].output == "three"
    assert all(s.duration >= 0 for s in steps)


def test_batch_stops_at_the_first_failure_with_its_output():
    changes = [Change("a", "ok", ("true",)), Change("b", "breaks", ("echo boom >&2", "false", "echo never")),
               Change("c", "not reached", ("touch /nonexistent/never",))]
    proc = run_locally(batch_script(changes))
    assert proc.returncode == 1
    steps = parse_steps(changes, proc.stdout)
    assert [(s.component, s.rc) for s in steps] == [("a", 0), ("b", 1)]
    assert steps[1].output == "boom"


def test_batch_keeps_metacharacters_as_data():
    changes = [Change("a", "quoted", ("printf '%s\\n' '$(echo owned); reboot'",))]
    proc = run_locally(batch_script(changes))
    assert parse_steps(changes, proc.stdout)[0].output == "$(echo owned); reboot"


def test_a_step_cut_off_midway_is_reported_unfinished():
    changes = [Change("a", "first", ("true",)), Change("b", "second", ("sleep 1",))]
    output = "@@gpuprov:step 0 start 1.0\n@@gpuprov:step 0 rc=0 1.5\n@@gpuprov:step 1 start 1.6\npartial"
    steps = parse_steps(changes, output)
    assert [(s.component, s.rc) for s in steps] == [("a", 0), ("b", None)]
    assert steps[1].output == "partial"


@pytest.mark.parametrize(("text", "total", "budget"), [(None, 10, 10), ("0", 10, 0), ("3", 10, 3), ("10%", 32, 3),
                                                        ("50%", 8, 4), ("100%", 5, 5)])
def test_failure_budget(text, total, budget):
    assert failure_budget(text, total) == budget


@pytest.mark.parametrize("text", ["-1", "abc", "150%", "1.5"])
def test_failure_budget_rejects_bad_input(text):
    with pytest.raises(InputError, match="--max-fail"):
        failure_budget(text, 10)


def test_prepare_changes_finish_dpkg_and_wait_for_cloud_init():
    facts = bare_facts() | {"dpkg_interrupted": True, "cloud_init": "running"}
    summaries = [c.summary for c in prepare_changes(facts)]
    assert summaries[0].startswith("wait for cloud-init") and "dpkg --configure -a" in summaries[1]
    assert prepare_changes(bare_facts() | {"dpkg_interrupted": False, "cloud_init": "done"}) == []


def _facts(**overrides) -> dict:
    facts = bare_facts()
    facts.update({"os": {"key": "debian-12", "family": "debian", "pretty_name": "Debian 12"},
                  "secure_boot": False, "nouveau_loaded": False, "package_manager_busy": [],
                  "dpkg_interrupted": False, "cloud_init": None, "disk_free_mib": {"/": 50000}})
    facts.update(overrides)
    return facts


def statuses(checks) -> dict:
    return {c.name: c.status for c in checks}


def test_preflight_all_pass_on_a_healthy_bare_host():
    checks = evaluate(_facts(), {"source": "200", "headers": "repo"}, make_repo(), make_stack())
    assert set(statuses(checks).values()) == {"pass"}


def test_preflight_failures_each_with_a_remedy():
    facts = _facts(secure_boot=True, disk_free_mib={"/": 1000}, nouveau_loaded=True,
                   package_manager_busy=["123 unattended-upgr"])
    checks = evaluate(facts, {"source": "000", "headers": "missing", "duplicate": "/etc/apt/sources.list.d/cuda.list"},
                      make_repo(proxy="http://user:secret@proxy:3128"), make_stack())
    got = statuses(checks)
    assert got["secure_boot"] == got["kernel_headers"] == got["package_source"] == got["disk /"] == "fail"
    assert got["duplicate_source"] == "fail"
    assert got["nouveau"] == got["package_manager"] == "warn"
    assert all(c.remedy for c in checks if c.status == "fail")
    assert not any("secret" in c.detail for c in checks)


def test_probe_sends_the_url_and_the_ca_on_stdin_never_on_the_command_line():
    command, stdin = probe_command(_facts(kernel="6.1.0-18-amd64"),
                                   make_repo(url="http://m/;touch /tmp/x;/", ca_pem="PEM"))
    assert "/InRelease" not in command  # the address travels on stdin, quoted data everywhere else
    assert "'\"'\"'m/;touch /tmp/x;'\"'\"'" in command
    assert stdin.startswith("http://m/;touch /tmp/x;\n\n") and stdin.endswith("PEM")


def test_parse_probe_and_mask_credentials():
    assert parse_probe("source=200\nheaders=known\nduplicate=/a\nduplicate=/b\n") == {
        "source": "200", "headers": "known", "duplicate": "/a /b"}
    assert mask_credentials("http://user:pw@proxy:3128/") == "http://***@proxy:3128/"


def test_preflight_without_probe_skips_the_remote_checks_only():
    checks = evaluate(_facts(secure_boot=True), None, make_repo(), make_stack())
    got = statuses(checks)
    assert got["package_source"] == got["duplicate_source"] == got["kernel_headers"] == "skip"
    assert got["secure_boot"] == "fail"


def test_a_reboot_change_leaves_the_reboot_required_mark():
    script = batch_script([Change("driver", "install", ("true",), reboot=True), Change("pins", "hold", ("true",))])
    step_driver, step_pins = script.split("@@gpuprov:step 1 start")
    assert "touch /run/reboot-required" in step_driver and "reboot-required" not in step_pins


def test_errors_never_show_url_credentials():
    from gpuprov.core.errors import GpuprovError

    error = GpuprovError("apt failed", host="gpu01", step="sources",
                         command="curl --proxy http://ops:s3cret@proxy:3128 https://mirror/key",
                         output="proxy http://ops:s3cret@proxy:3128 refused")
    assert "s3cret" not in str(error)
    assert "s3cret" not in str(error.to_dict())
    assert "http://***@proxy:3128" in str(error)


def test_a_file_only_batch_gathers_the_files_again_and_carries_the_other_facts_over(tmp_path):
    from helpers.local_host import LocalConn

    from gpuprov.core.apply import apply_changes
    from gpuprov.core.operations import managed_file, service_change

    path = str(tmp_path / "pins")
    known = {"host": "lab01", "kernel": "6.1.0-known", "files": {path: "old\n"}, "gpu_processes": [],
             "notices": ["kernel: kept", "files: stale"], "complete": True}
    change = managed_file("pins", path, "old\n", "new\n", "apt pins")
    conn = LocalConn()
    _, after = apply_changes(conn, [change], managed_files=(path,), known=known)
    script = conn.stdins[-1]
    assert "nvidia-smi" not in script and "uname -r" not in script   # nothing a file write cannot alter
    assert after["files"][path] == "new\n"                           # read again on the host, after the write
    assert after["kernel"] == "6.1.0-known" and after["gpu_processes"] == []
    assert after["notices"] == ["kernel: kept"] and after["complete"] is True

    # a change that may alter anything (a restart, a package) gathers everything again
    restart = service_change("svc", "gpuprov-test-none.service", {"exists": True, "enabled": True, "active": True},
                             restart=True)
    conn = LocalConn(answer=lambda command, stdin: "")   # a host that answers nothing: what is asked is the point
    with pytest.raises(GpuprovError, match="before all steps ran"):
        apply_changes(conn, [restart], managed_files=(path,), known=known)
    assert "nvidia-smi -q -x" in conn.stdins[-1] and "uname -r" in conn.stdins[-1]


def test_what_a_batch_can_alter():
    from gpuprov.core.operations import managed_file
    from gpuprov.facts.gather import affected

    write = managed_file("pins", "/etc/x", None, "x", "x")
    reload = managed_file("sshd", "/etc/y", None, "y", "y", then=("systemctl reload ssh",))
    assert affected([write]) == ("files", "docker")   # docker's facts are derived from daemon.json among the files
    assert affected([write, reload]) is None and affected([Change("pkg", "install x", ("apt-get install x",))]) is None
    marked = managed_file("kernel", "/etc/z", None, "z", "z", reboot=True)
    assert set(affected([marked])) == {"files", "docker", "gpuprov_reboot_pending", "reboot_required"}
