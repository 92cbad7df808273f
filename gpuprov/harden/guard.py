"""Commit-confirmed changes: before a firewall or sshd change the host schedules its own revert, and only a new SSH
connection from gpuprov cancels it.

`arm` is the first guarded step: it copies every file the batch may change (or records that it is absent) and
gpuprov's live nftables table into /var/lib/gpuprov/harden/RUN (on disk: a reboot inside the window keeps it),
writes revert.sh there, schedules it after N seconds (a transient systemd timer, else a detached background job),
enables a boot unit that runs it at the next boot, and marks the run `armed`. The revert (timer, boot or gpuprov)
and the confirmation race for one decision, `mkdir RUN/decided` (atomic): the first wins. Confirmed: the schedule is
cancelled and RUN/confirmed records when. Reverted: the files and the table are put back, the reload commands run,
and RUN/reverted records when and by whom. Either way `armed` goes last, so a decision a reboot cut short is
carried out as a revert at boot.

Every guarded step, the revert, the confirmation and the arming hold one lock, RUN's parent's `lock` (flock): a
revert that fires while a step runs waits for it, then undoes it; a step that starts after the decision refuses to
run. So once reverted, nothing of the change is left, at run time or at boot. The lock is also the host's harden
lock: a run arms only while no other run's guard is armed, and a refusal names that run (its `owner` file).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace

from gpuprov.core.operations import Change, write_file
from gpuprov.harden.firewall import TABLE

GUARD_DIR = "/var/lib/gpuprov/harden"
SYSTEMD_DIR = "/etc/systemd/system"
BOOT_UNIT = "gpuprov-harden-boot-revert.service"
MARK = "@@gpuprov-guard:"
RUN_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
REVERTERS = ("timer", "boot", "gpuprov")
LOCK_WAIT_S = 300       # how long the confirmation waits for a revert or step in progress
q = shlex.quote


def boot_unit(base: str = GUARD_DIR) -> str:
    """The oneshot unit, enabled while a guard is armed, that reverts an undecided run at boot: after the file
    systems, before gpuprov's firewall, sshd and the network come up."""
    return ("# Managed by gpuprov (invoke harden): at boot, puts back a firewall/sshd change whose run was neither\n"
            "# confirmed nor reverted (the host rebooted inside the confirm window). Enabled only while one is armed.\n"
            "[Unit]\nDescription=gpuprov harden: revert an unconfirmed firewall/sshd change\n"
            f"DefaultDependencies=no\nRequiresMountsFor={base}\nAfter=local-fs.target\n"
            "Before=network-pre.target gpuprov-firewall.service ssh.service sshd.service ssh.socket shutdown.target\n"
            "Conflicts=shutdown.target\n\n"
            "[Service]\nType=oneshot\n"
            f"ExecStart=/bin/sh -c 'for s in {base}/*/revert.sh; do [ -f \"$$s\" ] && /bin/sh \"$$s\" boot; "
            "done; exit 0'\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def undecided_script(base: str = GUARD_DIR) -> str:
    """Prints the owner of every armed (undecided) guard on the host, one MARK line each."""
    return (f"for a in {q(base)}/*/armed; do [ -f \"$a\" ] || continue; "
            f"echo \"{MARK}busy $(cat \"${{a%/armed}}/owner\" 2>/dev/null || echo \"${{a%/armed}}\")\"; done\n")


@dataclass(frozen=True)
class Guard:
    """The revert one guarded batch arms: what it restores, after how long; `owner` names the run to others."""

    run_id: str
    seconds: int
    files: tuple[str, ...]
    restore_table: bool            # put back gpuprov's live nftables table as it was
    reload: tuple[str, ...] = ()   # commands run once the files are back (sshd reload, systemd daemon-reload)
    base: str = GUARD_DIR
    owner: str = ""                 # "run ID from controller ADDRESS (user@host)": how a refused second run names it
    systemd_dir: str = SYSTEMD_DIR  # where the boot unit goes (when the host runs systemd)

    def __post_init__(self):
        if not RUN_ID.fullmatch(self.run_id) or self.seconds < 1:
            raise ValueError(f"bad guard {self.run_id!r} / {self.seconds}")

    @property
    def directory(self) -> str:
        return f"{self.base}/{self.run_id}"

    @property
    def unit(self) -> str:
        return f"gpuprov-harden-revert-{self.run_id}"

    @property
    def boot_unit_file(self) -> str:
        return f"{self.systemd_dir}/{BOOT_UNIT}"

    @property
    def boot_wants(self) -> str:
        return f"{self.systemd_dir}/multi-user.target.wants/{BOOT_UNIT}"

    def _lock(self) -> str:
        """Take the host's harden lock for the rest of the (sub)shell."""
        return f"exec 9>>{q(self.base + '/lock')} && flock 9"

    def _finish(self, d: str) -> str:
        """After a decision: the snapshots and the boot unit's link go, then `armed` (last)."""
        return f"rm -f {d}/f[0-9]* {d}/table.nft {d}/restore.nft {q(self.boot_wants)}; rm -f {d}/armed"

    def revert_script(self) -> str:
        """revert.sh [timer|boot|gpuprov]: restore unless the run is decided already (a decision a reboot cut short
        is finished as a revert). At boot nothing runs yet, so nothing is reloaded."""
        lines = ["#!/bin/sh", f"# gpuprov harden: puts back what run {self.run_id} changed unless gpuprov confirmed "
                 "it first", f"d={q(self.directory)}", 'by=${1:-timer}',
                 f'case $by in {"|".join(REVERTERS)}) ;; *) by=timer ;; esac', self._lock(),
                 '[ -f "$d/armed" ] || exit 0', 'mkdir "$d/decided" 2>/dev/null', 'exec >>"$d/revert.log" 2>&1',
                 'restore() { rm -f "$2"; if [ ! -e "$d/$1.absent" ]; then cp -a "$d/$1" "$2"; fi; }']
        lines += [f"restore f{i} {q(path)} && echo {q('restored ' + path)}" for i, path in enumerate(self.files)]
        if self.restore_table:
            lines += ['if [ -f "$d/table.nft" ]; then',
                      f"  {{ echo {q(f'table {TABLE} {{}}')}; echo {q(f'delete table {TABLE}')}; "
                      'cat "$d/table.nft"; } > "$d/restore.nft" && nft -f "$d/restore.nft" && '
                      "echo 'restored the nftables table'",
                      f"else nft delete table {TABLE} 2>/dev/null; echo 'removed the nftables table'; fi"]
        if self.reload:
            lines.append('if [ "$by" != boot ]; then')
            lines += [f"  {command} || echo {q('failed: ' + command)}" for command in self.reload]
            lines.append("fi")
        lines.append('echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $by" > "$d/reverted"')
        lines.append(self._finish('"$d"'))
        return "\n".join(lines) + "\n"

    def arm(self) -> Change:
        """The step that takes the host's harden lock (refused while another run's guard is armed), saves the current
        state and schedules the revert (a timer, and at the next boot)."""
        d, base, seconds = q(self.directory), q(self.base), self.seconds
        commands = [
            "command -v flock >/dev/null 2>&1 || { echo 'flock (util-linux) is missing: the revert cannot be "
            "serialised with the change' >&2; exit 1; }",
            f"mkdir -p {base} && chmod 700 {base}",
            f"if [ -L {base} ] || [ ! -O {base} ]; then echo {q(self.base + ' is not a folder of its own')} >&2; "
            "exit 1; fi",
            self._lock(),
            f"for a in {base}/*/armed; do [ -f \"$a\" ] || continue; echo \"refused: another harden run's guard is "
            "still undecided on this host: $(cat \"${a%/armed}/owner\" 2>/dev/null || echo \"${a%/armed}\")\" >&2; "
            "exit 1; done",
            f"mkdir -m 700 {d}",
            f"echo {q(self.owner or 'run ' + self.run_id)}\", started $(date -u +%Y-%m-%dT%H:%M:%SZ)\" > {d}/owner",
        ]
        commands += [f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then cp -a {q(path)} {d}/f{i}; "
                     f"else : > {d}/f{i}.absent; fi" for i, path in enumerate(self.files)]
        if self.restore_table:
            commands.append(f"if command -v nft >/dev/null 2>&1 && nft list table {TABLE} > {d}/table.nft "
                            f"2>/dev/null; then :; else rm -f {d}/table.nft; fi")
        commands.append(write_file(f"{self.directory}/revert.sh", self.revert_script(), "0700"))
        background = f"sleep {seconds}; exec /bin/sh {d}/revert.sh timer"
        systemd = "[ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1"
        commands += [
            f"if {systemd}; then {write_file(self.boot_unit_file, boot_unit(self.base))} && "
            f"mkdir -p {q(self.boot_wants.rsplit('/', 1)[0])} && ln -sf {q(self.boot_unit_file)} "
            f"{q(self.boot_wants)}; fi",
            f"if {systemd}; then "
            f"systemd-run --quiet --unit={q(self.unit)} --on-active={seconds} --timer-property=AccuracySec=1s "
            f"/bin/sh {d}/revert.sh timer; "
            "else "
            f"if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi; "
            f"$s nohup sh -c {q(background)} </dev/null >/dev/null 2>&1 9>&- & echo $! > {d}/pid; fi",
            f": > {d}/armed",   # last: only an armed run is reverted, and only once its revert is scheduled
        ]
        return Change("guard", f"schedule the host's own revert in {seconds}s and at the next boot (cancelled only "
                      "by a new SSH connection from gpuprov)", tuple(commands))

    def guarded(self, change: Change) -> Change:
        """`change` holding the host's harden lock, refused once the run is decided (its revert ran first)."""
        d = q(self.directory)
        check = (f"if [ ! -f {d}/armed ] || [ -d {d}/decided ]; then echo \"refused: the host already reverted run "
                 f"{self.run_id} ($(cat {d}/reverted 2>/dev/null || echo 'no guard armed')): nothing of this step "
                 "ran\" >&2; exit 1; fi")
        return replace(change, commands=(self._lock(), check, *change.commands))

    def _cancel(self) -> str:
        d = q(self.directory)
        return (f"systemctl stop {q(self.unit + '.timer')} >/dev/null 2>&1; "
                f"if [ -f {d}/pid ]; then kill \"$(cat {d}/pid)\" 2>/dev/null; fi; true")

    def _report(self) -> str:
        """Under the lock: what was decided (confirmed, reverted WHEN BY and the revert log, or pending)."""
        d = q(self.directory)
        return (f"if [ -f {d}/confirmed ]; then echo {MARK}confirmed \"$(cat {d}/confirmed)\"; "
                f"elif [ -f {d}/reverted ]; then echo {MARK}reverted \"$(cat {d}/reverted)\"; "
                f"cat {d}/revert.log 2>/dev/null; "
                f"else echo {MARK}pending; fi")

    def _locked(self, then: str) -> str:
        d = q(self.directory)
        return (f"if [ ! -d {d} ]; then echo {MARK}missing; exit 0; fi\n"
                f"exec 9>>{q(self.base + '/lock')}\n"
                f"if ! flock -w {LOCK_WAIT_S} 9; then echo {MARK}busy; exit 0; fi\n{then}\n")

    def confirm_script(self) -> str:
        """Run over the new connection: cancel the revert unless a decision came first; says which one it was."""
        d = q(self.directory)
        return self._locked(f"if [ -f {d}/armed ] && mkdir {d}/decided 2>/dev/null; then {self._cancel()}; "
                            f"date -u +%Y-%m-%dT%H:%M:%SZ > {d}/confirmed; {self._finish(d)}; fi\n{self._report()}")

    def revert_now_script(self) -> str:
        """Revert at once (a step failed, or the result is not what was asked); says what was put back."""
        d = q(self.directory)
        return (f"if [ ! -d {d} ]; then echo {MARK}missing; exit 0; fi\n/bin/sh {d}/revert.sh gpuprov\n"
                + self._locked(f"{self._cancel()}\n{self._report()}"))

    def status_script(self) -> str:
        """After the deadline: whether the host reverted by itself (waits for a revert in progress)."""
        return self._locked(self._report())


@dataclass(frozen=True)
class Answer:
    """A guard script's answer: confirmed | reverted | pending | missing | busy | unknown (no answer), when it was
    decided, by whom (timer, boot, gpuprov), the revert log."""

    word: str
    when: str = ""
    by: str = ""
    log: str = ""


def outcome(output: str) -> Answer:
    """The answer in a guard script's output."""
    for line in output.splitlines():
        if line.startswith(MARK):
            log = output.split(line, 1)[1].strip("\n")
            word, _, rest = line[len(MARK):].partition(" ")
            when, _, by = rest.strip().partition(" ")
            return Answer(word, when, by if by in REVERTERS else "", log)
    return Answer("unknown", log=output)
