"""The controller side of `invoke validate`: each host's suite config, its Python environment, the suite run,
fleet outliers and the multi-node all-reduce. The suite itself (gpuprov/smoke) runs on the host.

Where things live on a host, below /opt/gpuprov (root-owned and writable by root alone, as is every folder above
it: an existing /opt/gpuprov of another owner is refused, never re-owned, since its contents cannot be trusted):

    venv        the suite's Python (torch, numpy, onnx, onnxruntime and their dependencies, each pinned to its
                version and SHA-256) from the wheelhouse, made with root's own python3
    wheelhouse  the wheels of the current set (root only, 0700), each checked against the controller's SHA-256
    incoming    the SSH user's upload folder (0700): SFTP puts wheels there, root copies them out and checks them
    smoke       the suite (gpuprov/smoke), run as `python -m smoke` from /opt/gpuprov
    run         the suite config of the last run (config.json)
    multinode   the multi-node all-reduce worker, run as the unprivileged user gpuprov-validate
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The folders validation uses on a host (tests point `root` at a temporary folder)."""

    root: str = "/opt/gpuprov"

    @property
    def venv(self) -> str:
        return f"{self.root}/venv"

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def marker(self) -> str:
        """The digest of the wheel set the venv was built from."""
        return f"{self.venv}/.gpuprov-wheelset"

    @property
    def wheelhouse(self) -> str:
        return f"{self.root}/wheelhouse"

    @property
    def incoming(self) -> str:
        return f"{self.root}/incoming"

    @property
    def smoke(self) -> str:
        return f"{self.root}/smoke"

    @property
    def smoke_marker(self) -> str:
        return f"{self.smoke}/.gpuprov-digest"

    @property
    def run(self) -> str:
        return f"{self.root}/run"

    @property
    def config(self) -> str:
        return f"{self.run}/config.json"

    @property
    def multinode(self) -> str:
        return f"{self.root}/multinode"


LAYOUT = Layout()
