"""sshd hardening: a drop-in named to sort before cloud-init's 50-cloud-init.conf, checked with `sshd -t` before sshd
reloads it (a rejected file is taken back at once, so sshd never runs with it), judged afterwards on the effective
configuration (`sshd -T`, in the audit) rather than on the file."""

from __future__ import annotations

import shlex

from gpuprov.harden.policy import HardenPolicy
from gpuprov.ops.base import Change, unified_diff

DROPIN_DIR = "/etc/ssh/sshd_config.d"
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


def render(policy: HardenPolicy) -> str:
    """The drop-in's content."""
    from gpuprov.harden.templates import render_template

    return render_template("sshd_hardening.conf.j2", ssh=policy.ssh, algorithms=policy.algorithms)


def change(policy: HardenPolicy, facts: dict) -> Change | None:
    """Write the drop-in, `sshd -t`, then reload; None when the file is already the rendered one."""
    q = shlex.quote
    content = render(policy)
    current = (facts.get("files") or {}).get(DROPIN)
    if current == content:
        return None
    new, old = f"{DROPIN}.gpuprov-old", DROPIN
    commands = (
        f"mkdir -p {q(DROPIN_DIR)} /run/sshd",
        f"rm -f {q(new)}; if [ -e {q(old)} ]; then cp -p {q(old)} {q(new)}; fi",
        f"(umask 077 && printf %s {q(content)} > {q(DROPIN)}.gpuprov-tmp) && chmod 0600 {q(DROPIN)}.gpuprov-tmp "
        f"&& mv -f {q(DROPIN)}.gpuprov-tmp {q(DROPIN)}",
        # a configuration sshd -t rejects is taken back before anything reloads it
        f"if ! out=$(sshd -t 2>&1); then echo \"sshd -t rejected the configuration: $out\" >&2; "
        f"if [ -e {q(new)} ]; then mv -f {q(new)} {q(DROPIN)}; else rm -f {q(DROPIN)}; fi; "
        "echo 'the previous sshd configuration is back in place; sshd was not reloaded' >&2; exit 1; fi",
        f"rm -f {q(new)}",
        RELOAD_SSHD,
    )
    what = "update" if current is not None else "create"
    return Change("ssh", f"{what} {DROPIN} (sorts before {CLOUD_INIT_DROPIN}), check it with sshd -t, reload sshd",
                  commands, diff=unified_diff(DROPIN, current, content))
