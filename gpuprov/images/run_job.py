"""`invoke images.run` on the fleet runtime (gpuprov.core.runtime): on each host, gpuprov.images.run.run_image (the
driver check, docker pull, docker run with a PyTorch job's flags) of the image as that host pulls it: from its
registry, by the digest its lock records when there is one. The report is images-run-<stamp>.json; each host's
output (or error) is printed above the summary table.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError
from gpuprov.core.runtime import HostJob, HostRecord, error_line
from gpuprov.images.run import RunVars, run_image


@dataclass
class ContainerRecord(HostRecord):
    """One host's images.run: the image reference pulled, the container's name, the `docker run` line as run
    (masked), its exit code and output, and the note of a driver that runs the image through forward
    compatibility only. Status: ran (waited for) | started (--detach) | failed | skipped."""

    image: str = ""
    container: str = ""
    command: str = ""
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    note: str | None = None

    def details(self) -> dict:
        return {"image": self.image, "container": self.container, "command": self.command, "rc": self.rc,
                "stdout": self.stdout, "stderr": self.stderr, "note": self.note}


class ImageRunJob(HostJob):
    """Start one image on every selected host, in a container of one name, with the command after `--`."""

    kind = "images-run"
    columns = ("host", "status", "image", "container", "detail")
    variables = ("images", "data_dir", "stack")

    def __init__(self, image, *, registries: dict[str, str], settings: dict[str, RunVars],
                 stacks: dict[str, dict], locked: dict[str, list[dict]], min_driver: str | None, container: str,
                 detach: bool, command: list[str]):
        """`image`: the spec's image (gpuprov.images.spec); per host name, the registry it pulls from, its
        checked variables, its lock's stack and locked images; `min_driver`: the image's io.gpuprov.min-driver."""
        super().__init__()
        self.image, self.registries, self.settings = image, registries, settings
        self.stacks, self.locked, self.min_driver = stacks, locked, min_driver
        self.container, self.detach, self.command = container, detach, command

    def _pinned(self, host) -> dict | None:
        """The image's entry in the host's lock (digest and minimum driver), if its lock records the image."""
        return next((entry for entry in self.locked.get(host.name, []) if entry["name"] == self.image.id), None)

    def reference(self, host) -> str:
        """What the host pulls: REGISTRY/NAME@DIGEST when its lock records the image, else REGISTRY/NAME:TAG."""
        from gpuprov.images.tags import repository

        pinned = self._pinned(host)
        base = repository(self.image, self.registries[host.name])
        return f"{base}@{pinned['digest']}" if pinned else f"{base}:{self.image.version_tag}"

    def new_record(self, host) -> ContainerRecord:
        return ContainerRecord(host.name, image=self.reference(host), container=self.container)

    def run_host(self, conn, say) -> ContainerRecord:
        """run_image on the connected host; a GpuprovError fails the host with its record attached."""
        host = conn.host
        record = self.new_record(host)
        pinned = self._pinned(host)
        stack = self.stacks.get(host.name) or (host.vars.get("stack") or {})
        try:
            started = run_image(conn, record.image, min_driver=pinned["min_driver"] if pinned else self.min_driver,
                                forward_compat=bool(stack.get("forward_compat")), settings=self.settings[host.name],
                                container=self.container, detach=self.detach, command=self.command, say=say)
        except GpuprovError as exc:
            record.status = "failed"
            exc.run = record
            raise
        record.status = "started" if self.detach else "ran"
        record.image, record.container, record.command = started.image, started.container, started.command
        record.rc, record.stdout, record.stderr, record.note = started.rc, started.stdout, started.stderr, started.note
        return record

    def row(self, entry: dict) -> dict:
        return {"host": entry["host"], "status": entry["status"], "image": entry.get("image", ""),
                "container": entry.get("container", ""), "detail": error_line(entry) or entry.get("note") or ""}

    def print_details(self, entries: list[dict]) -> None:
        """Each host's output, each line prefixed [HOST] (the note of forward compatibility and the `docker run`
        line first), or its error as gpuprov prints errors (step, command, output's tail, what to do next)."""
        from gpuprov.core.report import console, styled

        out = console()
        for entry in entries:
            if entry.get("error"):
                shown = entry["error"]
                error = GpuprovError(shown["error"], host=shown.get("host"), step=shown.get("step"),
                                     command=shown.get("command"), output=shown.get("output"), hint=shown.get("hint"))
                for line in str(error).splitlines():
                    out.print(styled(line, "bold red"), soft_wrap=True)
                continue
            host = entry["host"]
            if entry.get("note"):
                out.print(styled(f"[{host}] note: {entry['note']}", "yellow"), soft_wrap=True)
            out.print(styled(f"[{host}] {entry['command']}", "dim"), soft_wrap=True)
            for line in (entry["stdout"] + entry["stderr"]).splitlines():
                out.print(styled(f"[{host}] {line}"), soft_wrap=True)

    def title(self) -> str:
        return f"images.run {self.image.id}"

    def report_fields(self) -> dict:
        return {"image": self.image.id, "container": self.container, "detach": self.detach}
