"""Commands and uploads on one host for `invoke validate`, over the host's one SSH connection.

Files go over SFTP as the inventory's user into folders that user owns (the wheelhouse and the staging folder
under /opt/gpuprov), and root commands move them into place. Small text files (the suite config, the
Prometheus textfile) travel on a root command's stdin into a temporary file of the target folder that is then
renamed over the target, so a reader never sees half a file.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path

from gpuprov.errors import GpuprovError


class Remote:
    """One connected host: `run` raises on failure with the command and its output; `put_*` upload over SFTP."""

    def __init__(self, conn, step: str = "validate"):
        self.conn = conn
        self.step = step
        self._sftp = None

    @property
    def name(self) -> str:
        return self.conn.host.name

    @property
    def user(self) -> str:
        return self.conn.host.user

    def run(self, command: str, *, sudo: bool = True, timeout: int | None = 300, stdin: str | None = None,
            step: str | None = None, hint: str | None = None, check: bool = True):
        """Run a command (as root by default); a non-zero exit raises GpuprovError unless check=False."""
        result = self.conn.run(command, sudo=sudo, timeout=timeout, stdin=stdin)
        if check and result.rc != 0:
            raise GpuprovError(f"command failed (exit {result.rc})", host=self.name, step=step or self.step,
                               command=result.shown_command(), output=(result.stderr or result.stdout),
                               hint=hint)
        return result

    # -- SFTP -------------------------------------------------------------------------------------------
    def sftp(self):
        """The host's SFTP client over its existing SSH connection (Fabric memoizes it and closes it with
        the connection)."""
        if self._sftp is None:
            opener = getattr(self.conn, "sftp", None)
            if callable(opener):
                self._sftp = opener()
            else:
                self.conn.open()
                self._sftp = self.conn._conn.sftp()  # Fabric's SFTP client of the HostConnection's session
        return self._sftp

    def put_file(self, local: Path, remote: str) -> None:
        """Upload a file to `remote` (a folder the SSH user may write): to `.NAME.part` first, then renamed."""
        folder, name = remote.rsplit("/", 1)
        partial = f"{folder}/.{name}.part"
        try:
            self.sftp().put(str(local), partial)
            self.sftp().posix_rename(partial, remote)
        except OSError as exc:
            raise GpuprovError(f"upload of {local.name} to {remote} failed: {exc}", host=self.name,
                               step=self.step, hint="check the host's free disk space under /opt") from None

    def put_bytes(self, data: bytes, remote: str) -> None:
        try:
            self.sftp().putfo(io.BytesIO(data), remote)
        except OSError as exc:
            raise GpuprovError(f"upload to {remote} failed: {exc}", host=self.name, step=self.step,
                               hint="check the host's free disk space under /opt") from None

    def user_folder(self, path: str, mode: str = "0755") -> None:
        """Create `path` (as root) owned by the SSH user, so that SFTP can write there."""
        q = shlex.quote
        self.run(f"install -d -m 0755 {q(path.rsplit('/', 1)[0])} && install -d -m {mode} -o {q(self.user)} "
                 f"{q(path)} && chown {q(self.user)} {q(path)} && chmod {mode} {q(path)}", timeout=60)

    def write_text(self, text: str, path: str, mode: str = "0644", step: str | None = None) -> None:
        """Place `text` at `path` atomically, as root: a temporary file in the same folder, then rename."""
        q = shlex.quote
        folder, name = path.rsplit("/", 1)
        script = (f"set -e; mkdir -p {q(folder)}; t=$(mktemp {q(f'{folder}/.{name}.XXXXXX')}); "
                  f"trap 'rm -f \"$t\"' EXIT; cat > \"$t\"; chmod {mode} \"$t\"; mv -f \"$t\" {q(path)}; trap - EXIT")
        self.run(f"sh -c {q(script)}", stdin=text, timeout=60, step=step)
