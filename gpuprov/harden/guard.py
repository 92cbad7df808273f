"""Commit-confirmed changes: before a firewall or sshd change the host schedules its own revert, and only a new SSH
connection from gpuprov cancels it.

`arm` is the first step of the guarded batch: it copies every file the batch may change (or records that it is
absent) and gpuprov's live nftables table into /run/gpuprov/harden/RUN, writes revert.sh there, and schedules it
to run after N seconds: a transient systemd timer (`systemd-run --on-active`), else a detached background job.
revert.sh and the confirmation race for one decision, `mkdir RUN/decided` (atomic): the first to create it
wins. Confirmed: the schedule is cancelled and RUN removed. Reverted: the files and the table are put back, the
reload commands run, and RUN/reverted records when.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuprov.harden.firewall import TABLE
from gpuprov.ops.base import Change, write_file

GUARD_DIR = "/run/gpuprov/harden"
MARK = "@@gpuprov-guard:"
RUN_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
q = shlex.quote


@dataclass(frozen=True)
class Guard:
    """The revert one guarded batch arms: what it restores, after how long."""

    run_id: str
    seconds: int
    files: tuple[str, ...]
    restore_table: bool            # put back gpuprov's live nftables table as it was
    reload: tuple[str, ...] = ()   # commands run once the files are back (sshd reload, systemd daemon-reload)
    base: str = GUARD_DIR

    def __post_init__(self):
        if not RUN_ID.fullmatch(self.run_id) or self.seconds < 1:
            raise ValueError(f"bad guard {self.run_id!r} / {self.seconds}")

    @property
    def directory(self) -> str:
        return f"{self.base}/{self.run_id}"

    @property
    def unit(self) -> str:
        return f"gpuprov-harden-revert-{self.run_id}"

    def revert_script(self) -> str:
        """revert.sh: restore unless the confirmation decided first."""
        d = q(self.directory)
        lines = ["#!/bin/sh", f"# gpuprov harden: puts back what run {self.run_id} changed unless gpuprov confirmed "
                 "it first", f"d={d}", 'mkdir "$d/decided" 2>/dev/null || exit 0', 'exec >"$d/revert.log" 2>&1',
                 'restore() { rm -f "$2"; if [ ! -e "$d/$1.absent" ]; then cp -a "$d/$1" "$2"; fi; }']
        lines += [f"restore f{i} {q(path)} && echo {q('restored ' + path)}" for i, path in enumerate(self.files)]
        if self.restore_table:
            lines += ['if [ -f "$d/table.nft" ]; then',
                      f"  {{ echo {q(f'table {TABLE} {{}}')}; echo {q(f'delete table {TABLE}')}; "
                      'cat "$d/table.nft"; } > "$d/restore.nft" && nft -f "$d/restore.nft" && '
                      "echo 'restored the nftables table'",
                      f"else nft delete table {TABLE} 2>/dev/null; echo 'removed the nftables table'; fi"]
        lines += [f"{command} || echo {q('failed: ' + command)}" for command in self.reload]
        lines.append('date -u +%Y-%m-%dT%H:%M:%SZ > "$d/reverted"')
        return "\n".join(lines) + "\n"

    def arm(self) -> Change:
        """The step that saves the current state and schedules the revert."""
        d, seconds = q(self.directory), self.seconds
        commands = [f"mkdir -p {q(self.base)} && mkdir -m 700 {d}"]
        commands += [f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then cp -a {q(path)} {d}/f{i}; "
                     f"else : > {d}/f{i}.absent; fi" for i, path in enumerate(self.files)]
        if self.restore_table:
            commands.append(f"if command -v nft >/dev/null 2>&1 && nft list table {TABLE} > {d}/table.nft "
                            f"2>/dev/null; then :; else rm -f {d}/table.nft; fi")
        commands.append(write_file(f"{self.directory}/revert.sh", self.revert_script(), "0700"))
        background = (f"sleep {seconds}; exec /bin/sh {d}/revert.sh")
        commands.append(
            "if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1; then "
            f"systemd-run --quiet --unit={q(self.unit)} --on-active={seconds} --timer-property=AccuracySec=1s "
            f"/bin/sh {d}/revert.sh; "
            "else "
            f"if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi; "
            f"$s nohup sh -c {q(background)} </dev/null >/dev/null 2>&1 & echo $! > {d}/pid; fi")
        return Change("guard", f"schedule the host's own revert in {seconds}s (cancelled only by a new SSH "
                      "connection from gpuprov)", tuple(commands))

    def _cancel(self) -> str:
        d = q(self.directory)
        return (f"systemctl stop {q(self.unit + '.timer')} >/dev/null 2>&1; "
                f"if [ -f {d}/pid ]; then kill \"$(cat {d}/pid)\" 2>/dev/null; fi; true")

    def _wait_reverted(self) -> str:
        d = q(self.directory)
        return (f"i=0; while [ ! -f {d}/reverted ] && [ $i -lt 120 ]; do sleep 1; i=$((i+1)); done; "
                f"echo {MARK}reverted \"$(cat {d}/reverted 2>/dev/null)\"; cat {d}/revert.log 2>/dev/null; "
                f"{self._cancel()}; rm -rf {d}")

    def confirm_script(self) -> str:
        """Run over the new connection: cancel the revert unless it ran first; says which happened."""
        d = q(self.directory)
        return (f"if [ ! -d {d} ]; then echo {MARK}missing; exit 0; fi\n"
                f"if mkdir {d}/decided 2>/dev/null; then {self._cancel()}; rm -rf {d}; echo {MARK}confirmed; "
                f"else {self._wait_reverted()}; fi\n")

    def revert_now_script(self) -> str:
        """Revert at once (a step failed, or the result is not what was asked); says what was put back."""
        d = q(self.directory)
        return (f"if [ ! -d {d} ]; then echo {MARK}missing; exit 0; fi\n"
                f"/bin/sh {d}/revert.sh; {self._wait_reverted()}\n")

    def status_script(self) -> str:
        """After the deadline: whether the host reverted by itself (waits for a revert in progress)."""
        d = q(self.directory)
        return (f"if [ ! -d {d} ]; then echo {MARK}missing; exit 0; fi\n"
                f"if [ -d {d}/decided ]; then {self._wait_reverted()}; else echo {MARK}pending; fi\n")


def outcome(output: str) -> tuple[str, str, str]:
    """(confirmed | reverted | missing | pending, when it reverted, the revert log) from a guard script's output."""
    head, _, log = output.partition("\n")
    for line in output.splitlines():
        if line.startswith(MARK):
            head = line
            log = output.split(line, 1)[1].strip("\n")
            break
    else:
        return "unknown", "", output
    word, _, when = head[len(MARK):].partition(" ")
    return word, when.strip(), log
