"""Secrets masked by registered value on every path out of gpuprov (issue 10 of the faults issue, issue 22 item 7): a
value no pattern could recognise (no `password=` near it, no URL login) is registered once and never shows in a JSON
report, a report sibling, an error's text or JSON, the command an error shows, the -v echo of a command, a file
diff, a Prometheus textfile label; and Ansible's `*_pass` variables count as secrets, by name and by value."""

from __future__ import annotations

import contextlib
import json
import shlex
from types import SimpleNamespace

from gpuprov.core import secrets
from gpuprov.core.errors import GpuprovError
from gpuprov.core.json_text import dump_json
from gpuprov.core.operations import managed_file
from gpuprov.core.report import write_json_report, write_report_sibling
from gpuprov.core.runtime import echoing
from gpuprov.validation.report import prometheus_textfile

SECRET = "Rv8 z'q1"   # a space and a quote: shell-quoted and JSON-escaped forms differ from the value


def test_json_report_and_its_latest_copy(tmp_path):
    secrets.register(SECRET)
    path = write_json_report(tmp_path, "provision", {"hosts": [{"output": f"apt said {SECRET}", SECRET: 1}]})
    for written in (path, tmp_path / "provision-latest.json"):
        text = written.read_text()
        assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text
        assert json.loads(text)["hosts"][0]["output"] == "apt said ***"


def test_report_sibling(tmp_path):
    secrets.register(SECRET)
    json_path = write_json_report(tmp_path, "validate", {})
    sibling = write_report_sibling(json_path, "validate", ".xml", f"<failure message='{SECRET}'/>")
    for written in (sibling, tmp_path / "validate-latest.xml"):
        assert SECRET not in written.read_text()


def test_error_text_json_and_the_command_shown_in_it():
    secrets.register(SECRET)
    error = GpuprovError(f"login failed for {SECRET}", host="gpu01", step="push",
                         command=f"docker login -p {shlex.quote(SECRET)} registry", output=f"denied {SECRET}",
                         hint=f"check {SECRET}")
    shown = str(error)
    assert SECRET not in shown and shlex.quote(SECRET) not in shown and "docker login -p *** registry" in shown
    assert SECRET not in dump_json({"error": error.to_dict()})
    assert all(SECRET not in value for value in error.to_dict().values() if value)


def test_the_verbose_echo_of_a_command(capsys):
    secrets.register(SECRET)

    class Conn:
        host = SimpleNamespace(name="gpu01")

        def run(self, command, **kwargs):
            return SimpleNamespace(rc=0, duration=0.1)

    echoing(Conn()).run(f"curl -u bob:{shlex.quote(SECRET)} https://mirror/")
    err = capsys.readouterr().err
    assert "curl -u bob:*** https://mirror/" in err and SECRET not in err


def test_a_file_diff():
    secrets.register(SECRET)
    change = managed_file("apt", "/etc/apt/auth.conf.d/gpuprov.conf", None, f"machine m login bob {SECRET}\n",
                          "mirror login")
    assert SECRET not in change.diff and "machine m login bob ***" in change.diff


def test_a_prometheus_textfile_label():
    secrets.register(SECRET)
    text = prometheus_textfile({"host": "gpu01", "results": [{"check": f"x{SECRET}", "status": "pass"}]}, 1.0)
    assert SECRET not in text and 'check="x***"' in text


def test_ansible_pass_variables_are_secrets_by_name():
    listing = {"_meta": {"hostvars": {"gpu01": {"ansible_become_pass": "Bq4w", "ansible_ssh_pass": "Cz7x",
                                                "ansible_host": "10.0.0.1", "bypass": "keep"}}}}
    masked = secrets.mask_data(listing)["_meta"]["hostvars"]["gpu01"]
    assert masked == {"ansible_become_pass": "***", "ansible_ssh_pass": "***", "ansible_host": "10.0.0.1",
                      "bypass": "keep"}
    assert secrets.mask("ansible_become_pass=Bq4w ansible_ssh_pass: Cz7x") == "ansible_become_pass=*** " \
                                                                              "ansible_ssh_pass: ***"
    assert secrets.mask("3 checks pass: host.ecc") == "3 checks pass: host.ecc"   # a word, not a key


def test_register_named_masks_a_read_value_wherever_it_shows_later():
    secrets.register_named({"all": {"vars": {"db_token": "Tk9-vq", "ansible_become_password": "Pw3-vq",
                                             "list": [{"vault_secret": "Vs1-vq"}], "port": 22, "name": "Nm-vq",
                                             "grafana_admin_password": "admin"}}})
    shown = secrets.mask("sudo got Pw3-vq, curl Tk9-vq, vault Vs1-vq, host Nm-vq, as admin")
    # a value under 6 characters (a lab's `admin`) is not registered: it would mask the word in every report
    assert shown == "sudo got ***, curl ***, vault ***, host Nm-vq, as admin"


def test_the_verbose_echo_of_a_failure_is_masked(capsys):
    secrets.register("Rv8-zq1")

    class Conn:
        host = SimpleNamespace(name="gpu01")

        def run(self, command, **kwargs):
            raise GpuprovError("login refused for Rv8-zq1")

    with contextlib.suppress(GpuprovError):
        echoing(Conn()).run("true")
    err = capsys.readouterr().err
    assert "gpu01: failed: login refused for ***" in err and "Rv8-zq1" not in err


def test_an_ansible_password_in_a_file_is_masked_though_never_read(tmp_path):
    from gpuprov.inventory import load_inventory

    (tmp_path / "hosts.ini").write_text("[gpu]\ngpu01 ansible_host=10.0.0.1 ansible_become_pass=Hq4-pw\n")
    load_inventory(tmp_path / "hosts.ini")
    assert secrets.mask("sudo: Hq4-pw") == "sudo: ***"
