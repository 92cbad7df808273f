"""The firewall change's own steps judged by nftables: the ruleset is staged and checked with `nft -c` before it
replaces the old file, so a ruleset nft rejects never takes its place."""

from __future__ import annotations

import subprocess

import pytest
from judges import needs_nft

from gpuprov.harden import nft
from gpuprov.harden.firewall import build_rules, render

pytestmark = [pytest.mark.root, pytest.mark.tool, needs_nft]


def until_load(change) -> subprocess.CompletedProcess:
    """The change's steps before the ruleset is loaded (stage, `nft -c`, rename), as the apply batch runs a step."""
    load = change.commands.index(f"nft -f {nft.RULESET}")
    return subprocess.run(["sh", "-ec", "\n".join(change.commands[:load])], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def ruleset_file(tmp_path, monkeypatch):
    path = tmp_path / "firewall.nft"
    monkeypatch.setattr(nft, "RULESET", str(path))
    return path


def test_a_ruleset_nft_accepts_replaces_the_old_file(ruleset_file):
    ruleset_file.write_text("# the old ruleset\n")
    ruleset = render(build_rules({}, [22]))
    change = nft.change({"files": {str(ruleset_file): "# the old ruleset\n"}}, ruleset, "load")
    result = until_load(change)
    assert result.returncode == 0, result.stderr
    assert ruleset_file.read_text() == ruleset
    assert oct(ruleset_file.stat().st_mode & 0o777) == "0o600"


def test_a_ruleset_nft_rejects_never_replaces_the_old_file(ruleset_file):
    old = render(build_rules({}, [22]))
    ruleset_file.write_text(old)
    broken = old.replace("policy drop;", "policy maybe;")
    assert broken != old
    result = until_load(nft.change({"files": {str(ruleset_file): old}}, broken, "load"))
    assert result.returncode != 0 and "nft -c rejected the ruleset" in result.stderr
    assert ruleset_file.read_text() == old
    assert [path.name for path in ruleset_file.parent.iterdir()] == [ruleset_file.name]   # nothing staged left
