"""sshd hardening: a drop-in named to sort before cloud-init's 50-cloud-init.conf, checked with `sshd -t` on the whole
configuration it will be part of before it replaces the old one (a rejected file never takes its place, so sshd never
runs with it), then sshd reloaded; judged afterwards on the effective configuration (`sshd -T`, in the audit) rather
than on the file. The harden guard still puts the old file back when the new one locks gpuprov out."""

from __future__ import annotations

import shlex

from gpuprov.core.operations import Change, managed_file
from gpuprov.harden.policy import HardenPolicy

SSH_DIR = "/etc/ssh"
DROPIN_DIR = f"{SSH_DIR}/sshd_config.d"
DROPIN = f"{DROPIN_DIR}/10-gpuprov-hardening.conf"
CLOUD_INIT_DROPIN = "50-cloud-init.conf"
# reload whichever sshd runs: the unit (Debian/Ubuntu ssh, RHEL sshd), a socket-activated one (takes the file at its
# next start), or a daemon without systemd (SIGHUP to its pid file)
RELOAD_SSHD = (
    "if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet ssh.service; then "
    "systemctl reload ssh.service; "
    "elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet sshd.service; then "
    "systemctl reload sshd.service; "
    "elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet ssh.socket; then :; "
    "elif [ -f /run/sshd.pid ]; then kill -HUP \"$(cat /run/sshd.pid)\"; "
    "else echo 'no running sshd found to reload' >&2; false; fi")


def whole_config_check() -> str:
    """A validate template (`%s`: the staged drop-in) running `sshd -t -f` on a whole configuration: a copy of
    SSH_DIR/sshd_config whose Include of sshd_config.d reads a copy of that folder with the staged file in the drop-in's
    place, so sshd judges exactly what it reads after the rename (cloud-init's and every other drop-in included)."""
    etc, name = SSH_DIR, DROPIN.rsplit("/", 1)[1]
    # an Include word naming ETC/sshd_config.d/... (or sshd_config.d/..., relative to /etc/ssh) points at the copy
    rewrite = ('{ if (tolower($1) == "include") for (i = 2; i <= NF; i++) { '
               'if (index($i, etc) == 1) $i = dir substr($i, length(etc) + 1); '
               'else if (index($i, "sshd_config.d/") == 1) $i = dir substr($i, 15) } print }')
    script = ("d=$(mktemp -d) || exit 1; trap 'rm -rf \"$d\"' EXIT; mkdir -p /run/sshd \"$d/conf.d\" || exit 1; "
              f"for f in {shlex.quote(etc)}/sshd_config.d/*.conf; do "
              "if [ -f \"$f\" ]; then cp \"$f\" \"$d/conf.d/\" || exit 1; fi; done; "
              f"cp \"$1\" \"$d/conf.d/{name}\" && "
              f"awk -v etc={shlex.quote(etc + '/sshd_config.d/')} -v dir=\"$d/conf.d/\" {shlex.quote(rewrite)} "
              f"{shlex.quote(etc + '/sshd_config')} > \"$d/sshd_config\" && sshd -t -f \"$d/sshd_config\"")
    return f"sh -c {shlex.quote(script)} sh %s"


def render(policy: HardenPolicy) -> str:
    """The drop-in's content."""
    from gpuprov.harden.templates import render_template

    return render_template("sshd_hardening.conf.j2", ssh=policy.ssh, algorithms=policy.algorithms)


def change(policy: HardenPolicy, facts: dict) -> Change | None:
    """Stage the drop-in, `sshd -t` the whole configuration with it, put it in place, reload sshd; None when the file
    already is the rendered one."""
    current = (facts.get("files") or {}).get(DROPIN)
    return managed_file("ssh", DROPIN, current, render(policy), f"sorts before {CLOUD_INIT_DROPIN}", mode="0600",
                        validate=whole_config_check(), rejected="sshd -t rejected the configuration",
                        then=(RELOAD_SSHD,),
                        summary=f"{'update' if current is not None else 'create'} {DROPIN} (sorts before "
                                f"{CLOUD_INIT_DROPIN}), check it with sshd -t before it replaces the old one, "
                                "reload sshd")
