"""Commands and uploads on one host for `invoke validate`, over the host's one SSH connection.

Nothing the SSH user can write is run or installed by root unchecked: wheels go over SFTP into the SSH user's
upload folder (/opt/gpuprov/incoming), and root copies them into root-only folders and checks their SHA-256
there. Small files (the suite, its config, the Prometheus textfile) travel on a root command's stdin into a
temporary file of the target folder that is then renamed over the target, so a reader never sees half a file;
root writes only into folders that nobody else can change (every folder of the path root-owned and writable by
root alone), so no symlink can be swapped in.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpuprov.core.errors import GpuprovError

# A shell function: `secure PATH` succeeds when PATH and every folder above it, followed through symlinks
# (the path as given and its real path), are owned by root and writable by root alone; else it prints why.
# A folder writable by others counts only when sticky (/tmp) and not the last component: nobody but root can
# then rename or replace the root-owned entry below it.
SECURE = r"""secure() {
  for p in "$1" "$(readlink -f -- "$1")"; do
    c=$p; last=1
    while :; do
      s=$(stat -c '%u %a %F' -- "${c:-/}" 2>/dev/null) || { echo "${c:-/} does not exist"; return 1; }
      set -- $s
      if [ "$1" != 0 ]; then echo "${c:-/} is owned by uid $1, not root"; return 1; fi
      if [ "$3" != symbolic ] && [ $((0$2 & 022)) -ne 0 ]; then
        if [ "$3" != directory ] || [ $((0$2 & 01000)) -eq 0 ] || [ $last = 1 ]; then
          echo "${c:-/} is writable by group or others (mode $2)"; return 1
        fi
      fi
      [ -n "$c" ] || break
      c=${c%/*}; last=0
    done
  done
}"""
INSECURE = 86   # the exit status of a root script that refused an unsafe path


def existing_parent() -> str:
    """Shell: `$d`, the deepest existing folder of `$f` (checked before creating anything below it)."""
    return 'd=$f; while [ ! -e "$d" ] && [ -n "$d" ]; do d=${d%/*}; done; d=${d:-/}'



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
            self._sftp = self.conn.sftp()
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

    def user_folder(self, path: str, mode: str = "0700") -> None:
        """Create `path` (as root, in a root folder) owned by the SSH user, so that SFTP can write there: what
        lands in it is the SSH user's and is checked by root before use."""
        q = shlex.quote
        self.root_folder(path.rsplit("/", 1)[0])
        self.run(f"install -d -m {mode} -o {q(self.user)} {q(path)} && chown -h {q(self.user)} {q(path)} && "
                 f"chmod {mode} {q(path)}", timeout=60)

    def root_folder(self, path: str, mode: str = "0755", hint: str | None = None, step: str | None = None) -> None:
        """Make sure `path` is a folder root alone can change (created so when missing, with `mode`); one that
        exists with another owner, or below a folder others may write, is refused (GpuprovError, exit 86)."""
        self.guarded(self.root_folder_script(path, mode), path, step=step, hint=hint or (
            f"make {path} and every folder above it owned by root and writable by root alone (chown root:root; "
            "chmod go-w), or remove what another user owns there: root never writes into it otherwise"))

    def guarded(self, command: str, path: str, *, stdin: str | None = None, step: str | None = None,
                hint: str | None = None, timeout: int = 60):
        """Run a root script that refuses an unsafe path (exit INSECURE) with that refusal as the error."""
        result = self.run(command, stdin=stdin, timeout=timeout, step=step, hint=hint, check=False)
        if result.rc == INSECURE:
            why = (result.stderr.strip().splitlines() or ["refused"])[-1].removeprefix("refused: ")
            raise GpuprovError(f"root does not write into {path}: {why}", host=self.name, step=step or self.step,
                               command=result.shown_command(), hint=hint)
        if result.rc != 0:
            raise GpuprovError(f"command failed (exit {result.rc})", host=self.name, step=step or self.step,
                               command=result.shown_command(), output=(result.stderr or result.stdout), hint=hint)
        return result

    @staticmethod
    def root_folder_script(path: str, mode: str = "0755") -> str:
        """The shell of root_folder (for scripts that go on to write into `path`)."""
        q = shlex.quote
        return "\n".join([
            SECURE, f"f={q(path)}", existing_parent(),
            f'why=$(secure "$d") || {{ echo "refused: $why" >&2; exit {INSECURE}; }}',
            f'[ -d "$f" ] || {{ mkdir -p -m {mode} "$f" && chmod {mode} "$f"; }}',
            f'why=$(secure "$f") || {{ echo "refused: $why" >&2; exit {INSECURE}; }}',
        ])

    def write_text(self, text: str, path: str, mode: str = "0644", step: str | None = None,
                   hint: str | None = None) -> None:
        """Place `text` at `path` atomically, as root: a temporary file in the same folder, then rename. The
        folder must be one root alone can change (root_folder), so nobody can swap a symlink in."""
        q = shlex.quote
        folder, name = path.rsplit("/", 1)
        script = "\n".join([
            "set -e", self.root_folder_script(folder),
            f"t=$(mktemp {q(f'{folder}/.{name}.XXXXXX')})", "trap 'rm -f \"$t\"' EXIT",
            f'cat > "$t"; chmod {mode} "$t"; mv -f "$t" {q(path)}; trap - EXIT'])
        self.guarded(f"sh -c {q(script)}", folder, stdin=text, step=step, hint=hint or (
            f"root writes {path} only into a folder root alone can change: make {folder} and every folder above "
            "it owned by root and writable by root alone (chown root:root; chmod go-w)"))
