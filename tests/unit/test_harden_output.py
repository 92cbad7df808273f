"""What harden prints: user text literally (no escape sequence or markup reaches the terminal), the controls table
and the summary row."""

from __future__ import annotations

from gpuprov.harden.output import controls_table, print_hosts, summary_row

RUN = {"host": "gpu[01]\x1b[31m", "status": "rolled back", "controller": {"address": "10.0.0.9", "port": 22},
       "refusals": [], "overridden": ["the firewall would drop SSH from 10.0.0.9"],
       "plan": [{"component": "firewall", "summary": "load [bold]x[/bold]", "diff": "+a\n-b"}],
       "guard": {"result": "rolled back by the host", "detail": "no new SSH connection got through",
                 "log": "restored /etc/gpuprov/firewall.nft\nrestored the nftables table"},
       "controls": [{"id": "ssh-macs", "status": "fail", "observed": ["hmac-sha1", "umac-64@openssh.com"],
                     "expected": ["hmac-sha2-512-etm@openssh.com"]},
                    {"id": "tmp-noexec", "status": "waived", "observed": "not a separate mount",
                     "expected": "noexec"}]}


def test_user_text_is_printed_literally(capsys):
    print_hosts([RUN], dry_run=True, confirm_timeout=45)
    controls_table([RUN])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "gpu[01]\\x1b[31m" in out
    assert "load [bold]x[/bold]" in out
    assert "rolled back by the host: no new SSH connection got through" in out
    assert "restored the nftables table" in out
    assert "hmac-sha1,umac-64@openssh.com" in out
    assert "undone after 45s unless a new SSH connection from gpuprov confirms them" in out


def test_summary_row_counts_controls_and_names_failures():
    assert summary_row(RUN) == {"host": "gpu[01]\x1b[31m", "status": "rolled back", "changes": 1,
                                "controller": "10.0.0.9", "controls": "0 pass, 1 fail, 1 waived",
                                "detail": "rolled back by the host; failing: ssh-macs"}


def test_an_unknown_guard_outcome_prints_where_to_look_on_the_host(capsys):
    unknown = {**RUN, "guard": {"result": "unknown", "detail": "the host has no guard folder for this run", "log": "",
                                "hint": "on the host's console: ls /var/lib/gpuprov/harden/20261202T020000-ab12cd34"}}
    print_hosts([unknown], dry_run=False, confirm_timeout=60)
    out = capsys.readouterr().out
    assert "unknown: the host has no guard folder for this run" in out
    assert "hint: on the host's console: ls /var/lib/gpuprov/harden/20261202T020000-ab12cd34" in out
    assert summary_row(unknown)["detail"] == "unknown; failing: ssh-macs"
