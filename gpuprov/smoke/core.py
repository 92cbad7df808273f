"""Results, the check registry and the context every check gets."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"
STATUSES = (PASS, FAIL, SKIP, WARN)
LEVELS = ("quick", "burn-in")

PACKAGE = __package__ or "smoke"
SUITE_DIR = Path(__file__).resolve().parent
# The folder that must be on sys.path for `python -m PACKAGE` (/opt/gpuprov for "smoke", the repo for
# "gpuprov.smoke").
ROOT = SUITE_DIR.parents[len(PACKAGE.split(".")) - 1]


@dataclasses.dataclass
class Result:
    """One check's verdict: always a reason, and the figures it measured and judged against."""

    check: str
    status: str
    reason: str
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    thresholds: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Check:
    """A registered check: `fn(ctx) -> Result`, run in its own process under `timeout` seconds, plus the seconds
    `load(config)` gives for a load whose length the config sets (the burn-in time)."""

    name: str
    fn: Callable[[Context], Result]
    timeout: float
    levels: tuple[str, ...]
    load: Callable[[dict], float] | None = None

    def timeout_for(self, config: dict) -> float:
        """The timeout of this check under `config`: its own, plus the load time the config sets for it."""
        return self.timeout + (self.load(config) if self.load else 0.0)


REGISTRY: dict[str, Check] = {}


def check(name: str, *, timeout: float, levels: tuple[str, ...] = LEVELS, load: Callable[[dict], float] | None = None):
    """Register a check under a dotted name (`host.ecc`, `train.ddp`, `perf.matmul`); `load(config)`: seconds of
    load the config asks of it on top of `timeout` (so a burn-in of N minutes is never cut by the timeout)."""

    def register(fn: Callable[[Context], Result]) -> Callable[[Context], Result]:
        REGISTRY[name] = Check(name, fn, timeout, levels, load)
        return fn

    return register


@dataclasses.dataclass
class Context:
    """What a check knows: the controller's config (expected stack, datasheet, thresholds, level) and how to
    run a command with a timeout."""

    config: dict

    @property
    def level(self) -> str:
        return self.config.get("level", "quick")

    def expect(self, key: str, default: Any = None) -> Any:
        return (self.config.get("expect") or {}).get(key, default)

    def run(self, argv: list[str], timeout: float = 30.0) -> tuple[int, str, str]:
        """Run a command (never through a shell); rc 127 when it is missing, 124 when it timed out."""
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            return 124, "", f"{' '.join(argv)}: timed out after {timeout:g} s"
        return done.returncode, done.stdout, done.stderr


def version_matches(expected: object, actual: str | None) -> bool:
    """On the components both give (their common precision): `570.148.08` equals exactly; `570` or `570.148`
    (`12.8`) matches the versions it starts (570.148.08; 12.8.1, not 12.80); `9.1.0.70` (a release note's cuDNN)
    matches `9.1.0` (torch's). At least major.minor where the expectation gives them: `12` does not match `12.8`.
    No version matches nothing."""
    if actual is None:
        return False
    want, have = str(expected).split("."), actual.split(".")
    common = min(len(want), len(have))
    return common >= min(2, len(want)) and have[:common] == want[:common]
