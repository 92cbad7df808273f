"""What a host sends back, checked before anything uses it: the suite's result document and the multi-node
all-reduce line. A host is not trusted: a document with a wrong type, a number that is not finite, an unknown
status, a string or list beyond its bound, or a figure above what its GPU can do (the datasheet in
gpuprov/data/gpus.yaml) is refused with where it is wrong; the caller makes that the host's failure.

The schemas are declared below (SUITE, RESULT, ALLREDUCE) from a few node types, each of which checks a value
and names the path of what is wrong (`results[3].figures.per_gpu.0.bf16_tflops`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuprov.smoke.core import LEVELS, STATUSES

SCHEMA = 1
DEPTH = 10                      # nesting of free-form figures and thresholds
TEXT_CHARS = 65536              # any string a host sends
LIST_ITEMS = 4096               # any list or mapping a host sends
MAX_INT = 2**63                 # integers beyond this are no measurement (and floats cannot hold them)
# A figure may exceed its datasheet peak by this much (timer granularity); beyond it the host measured wrong,
# or lies. Peak figures are the datasheet's dense peaks at boost clock: no honest run goes above them.
MARGIN_PCT = 5
# Inferences a second: no datasheet figure bounds them, but a call takes at least a kernel launch (microseconds)
MAX_PER_SECOND = 1e8

# check -> figure -> the datasheet keys that bound it, the first one the GPU's datasheet has wins (each later
# key is a higher peak of the same GPU: tf32 <= fp16 rate, an fp32 matmul <= tf32; a host copy or a reduction
# cannot move bytes faster than the GPU's memory). With no datasheet value at all, the highest value of the
# catalog bounds it: no GPU does more than the fastest one.
LIMITS = {
    "perf.matmul": {"bf16_tflops": ("bf16_tflops", "fp16_tflops"), "fp16_tflops": ("fp16_tflops",),
                    "tf32_tflops": ("tf32_tflops", "fp16_tflops"), "fp32_tflops": ("tf32_tflops", "fp16_tflops"),
                    # the burn-in's sustained load (bf16, or fp16 where the GPU has no bf16)
                    "first_minute_tflops": ("bf16_tflops", "fp16_tflops"),
                    "last_third_tflops": ("bf16_tflops", "fp16_tflops")},
    "perf.copy": {"d2d_gbs": ("mem_bw_gbs",), "h2d_gbs": ("pcie_gbs", "mem_bw_gbs"),
                  "d2h_gbs": ("pcie_gbs", "mem_bw_gbs")},
    "perf.allreduce": {"busbw_gbs": ("mem_bw_gbs",)},
    "multinode.allreduce": {"busbw_gbs": ("mem_bw_gbs",), "algbw_gbs": ("mem_bw_gbs",)},
}
UNITS = {"tflops": "TFLOP/s", "gbs": "GB/s"}
RATES = {"infer.latency": ("b1_per_s", "b32_per_s")}


class DocumentError(ValueError):
    """A document a host sent is not what it must be: `where` names the place, the message says why."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}" if where else why)
        self.where, self.why = where, why


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _shown(value: Any) -> str:
    """A value as an error shows it: short, one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------------ node types

class Node(Protocol):
    """A schema node: returns the value checked (a copy with defaults filled in), or raises DocumentError."""

    def check(self, value: Any, where: str) -> Any: ...


@dataclass(frozen=True)
class Number:
    """A finite int or float (never a bool) within [low, high]; with `whole`, an int."""

    low: float = -math.inf
    high: float = math.inf
    whole: bool = False

    def check(self, value: Any, where: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DocumentError(where, f"must be a number, not {type(value).__name__} {_shown(value)}")
        if isinstance(value, int) and abs(value) >= MAX_INT or isinstance(value, float) and not math.isfinite(value):
            raise DocumentError(where, f"must be a finite number, not {_shown(value)}")
        if self.whole and not isinstance(value, int):
            raise DocumentError(where, f"must be a whole number, not {_shown(value)}")
        if not self.low <= value <= self.high:
            raise DocumentError(where, f"{_shown(value)} is outside {self.low:g}..{self.high:g}")
        return value


@dataclass(frozen=True)
class Text:
    """A string of at most `chars` characters, matching `pattern` when one is given."""

    chars: int = TEXT_CHARS
    pattern: str | None = None

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, str):
            raise DocumentError(where, f"must be a string, not {type(value).__name__} {_shown(value)}")
        if len(value) > self.chars:
            raise DocumentError(where, f"is {len(value)} characters long, at most {self.chars} allowed")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise DocumentError(where, f"{_shown(value)} does not match {self.pattern}")
        return value


@dataclass(frozen=True)
class OneOf:
    """One of the given values (compared with ==, types too: True is not 1)."""

    values: tuple

    def check(self, value: Any, where: str) -> Any:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise DocumentError(where, f"{_shown(value)} is not one of {', '.join(map(repr, self.values))}")
        return value


@dataclass(frozen=True)
class Nullable:
    """None, or what `inner` accepts."""

    inner: Node

    def check(self, value: Any, where: str) -> Any:
        return None if value is None else self.inner.check(value, where)


@dataclass(frozen=True)
class AnyOf:
    """What the first of `options` accepts (their errors are reported together)."""

    options: tuple[Node, ...]
    what: str

    def check(self, value: Any, where: str) -> Any:
        for option in self.options:
            try:
                return option.check(value, where)
            except DocumentError:
                continue
        raise DocumentError(where, f"must be {self.what}, not {type(value).__name__} {_shown(value)}")


@dataclass(frozen=True)
class Json:
    """Free-form JSON (figures, thresholds): null, booleans, finite numbers, bounded strings, lists and
    mappings with string keys, nested at most `depth` deep."""

    depth: int = DEPTH

    def check(self, value: Any, where: str) -> Any:
        return self._walk(value, where, self.depth)

    def _walk(self, value: Any, where: str, depth: int) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            return Number().check(value, where)
        if isinstance(value, str):
            return Text().check(value, where)
        if not isinstance(value, list | dict):
            raise DocumentError(where, f"{type(value).__name__} is no JSON value")
        if depth <= 0:
            raise DocumentError(where, f"is nested more than {self.depth} levels deep")
        if len(value) > LIST_ITEMS:
            raise DocumentError(where, f"has {len(value)} items, at most {LIST_ITEMS} allowed")
        if isinstance(value, list):
            return [self._walk(item, _at(where, i), depth - 1) for i, item in enumerate(value)]
        return {Text(256).check(key, where): self._walk(item, _at(where, key), depth - 1)
                for key, item in value.items()}


@dataclass(frozen=True)
class ListOf:
    """A list of at most `items` values, each what `item` accepts; with `unique`, no two share that key."""

    item: Node
    items: int = LIST_ITEMS
    unique: str | None = None

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise DocumentError(where, f"must be a list, not {type(value).__name__} {_shown(value)}")
        if len(value) > self.items:
            raise DocumentError(where, f"has {len(value)} items, at most {self.items} allowed")
        out = [self.item.check(item, _at(where, i)) for i, item in enumerate(value)]
        if self.unique:
            seen: dict = {}
            for i, item in enumerate(out):
                if item[self.unique] in seen:
                    raise DocumentError(_at(where, i), f"{self.unique} {_shown(item[self.unique])} comes twice "
                                                       f"(first at {_at(where, seen[item[self.unique]])})")
                seen[item[self.unique]] = i
        return out


@dataclass(frozen=True)
class MapOf:
    """A mapping of at most `items` string keys (what `key` accepts) to what `value` accepts."""

    key: Node
    value: Node
    items: int = LIST_ITEMS

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise DocumentError(where, f"must be a mapping, not {type(value).__name__} {_shown(value)}")
        if len(value) > self.items:
            raise DocumentError(where, f"has {len(value)} keys, at most {self.items} allowed")
        return {self.key.check(k, where): self.value.check(v, _at(where, k)) for k, v in value.items()}


@dataclass(frozen=True)
class Record:
    """A mapping of known keys: `required` ones must be there, optional ones get their default when missing,
    and a key that is not declared is refused."""

    fields: dict[str, Node]
    required: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise DocumentError(where, f"must be a mapping, not {type(value).__name__} {_shown(value)}")
        unknown = [key for key in value if key not in self.fields]
        if unknown:
            raise DocumentError(where, f"unknown key {_shown(unknown[0])} (known: {', '.join(self.fields)})")
        missing = [key for key in self.required if key not in value]
        if missing:
            raise DocumentError(where, f"{missing[0]} is missing")
        out = {key: node.check(value[key], _at(where, key)) for key, node in self.fields.items() if key in value}
        return {**{key: _copy(default) for key, default in self.defaults.items() if key not in out}, **out}


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


# ---------------------------------------------------------------------------------------------------- schemas

CHECK_NAME = r"[a-z][a-z0-9_]*([.:][a-z0-9_]+)*"      # host.ecc, perf.matmul, import:perf_matmul
SCALAR = AnyOf((Nullable(Text()), OneOf((True, False)), Number()), "a string, a number, a boolean or null")

RESULT = Record({
    "check": Text(100, CHECK_NAME),
    "status": OneOf(STATUSES),
    "reason": Text(),
    "figures": MapOf(Text(256), Json(DEPTH - 1)),
    "thresholds": MapOf(Text(256), Json(DEPTH - 1)),
    "seconds": Number(0, 7 * 86400),
}, required=("check", "status", "reason"), defaults={"figures": {}, "thresholds": {}, "seconds": 0.0})

SUITE = Record({
    "schema": OneOf((SCHEMA,)),
    "host": Text(255),
    "level": OneOf(LEVELS),
    "strict": OneOf((True, False)),
    "started": Text(64),
    "seconds": Number(0, 7 * 86400),
    "versions": MapOf(Text(64), SCALAR, items=64),
    "results": ListOf(RESULT, items=256, unique="check"),
}, required=("schema", "results"), defaults={"versions": {}})

ALLREDUCE = Record({
    "world_size": Number(1, 1 << 20, whole=True),
    "backend": OneOf(("nccl", "gloo")),
    "device": OneOf(("cuda", "cpu")),
    "nodes": ListOf(Text(255), items=LIST_ITEMS),
    "ranks": ListOf(MapOf(Text(64), SCALAR, items=16)),
    "uids": ListOf(Number(0, 2**32, whole=True)),
    "size_bytes": Number(1, 1 << 40, whole=True),
    "iters": Number(1, 1 << 20, whole=True),
    "expected_sum": Number(0, 1 << 62),
    "wrong_elements": Number(0, 1 << 40, whole=True),
    "time_s": Number(0, 86400),
    "algbw_gbs": Number(0),
    "busbw_gbs": Number(0),
}, required=("world_size", "backend", "nodes", "size_bytes", "expected_sum", "wrong_elements", "algbw_gbs",
             "busbw_gbs"))


# --------------------------------------------------------------------------------------------- sanity bounds

@functools.cache
def catalog_peak(key: str) -> float | None:
    """The highest value of a datasheet key over the catalog's GPUs."""
    from gpuprov.stack.data import table

    values = [row.get(key) for row in table("gpus")["models"].values()]
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


def bound(check: str, figure: str, datasheet: dict | None) -> tuple[float, str] | None:
    """The most `figure` of `check` can honestly be on a GPU with this datasheet, and what says so."""
    keys = (LIMITS.get(check) or {}).get(figure)
    if keys is None:
        return (MAX_PER_SECOND, "a call takes at least a kernel launch") if figure in RATES.get(check, ()) else None
    margin = 1 + MARGIN_PCT / 100
    for key in keys:
        value = (datasheet or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value) * margin, f"the datasheet's {key} {value:g} + {MARGIN_PCT} %"
    peak = catalog_peak(keys[-1])
    return (peak * margin, f"the catalog's highest {keys[-1]} {peak:g} + {MARGIN_PCT} %") if peak else None


def check_bounds(check: str, figures: Any, datasheet: dict | None, where: str) -> None:
    """Every figure `check` bounds, wherever it is in `figures` (per_gpu rows too), against its bound."""
    if isinstance(figures, list):
        for i, item in enumerate(figures):
            check_bounds(check, item, datasheet, _at(where, i))
        return
    if not isinstance(figures, dict):
        return
    for key, value in figures.items():
        if isinstance(value, dict | list):
            check_bounds(check, value, datasheet, _at(where, key))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            limit = bound(check, key, datasheet)
            if limit is None:
                continue
            if value < 0:
                raise DocumentError(_at(where, key), f"{check} {key} {value:g} is negative")
            if value > limit[0]:
                unit = UNITS.get(key.rsplit("_", 1)[-1], "/s")
                raise DocumentError(_at(where, key), f"{check} {key} {value:g} {unit} is above what the GPU can do: "
                                                     f"{limit[0]:g} ({limit[1]})")


# ------------------------------------------------------------------------------------------------ documents

def suite_document(document: Any, datasheet: dict | None = None) -> dict:
    """The suite's result document, checked against SUITE and every result's figures against the GPU's
    datasheet (the suite config's `datasheet`). Returns a checked copy with defaults filled in."""
    out = SUITE.check(document, "")
    for i, result in enumerate(out["results"]):
        check_bounds(result["check"], result["figures"], datasheet, f"results[{i}].figures")
    return out


def allreduce_document(document: Any, datasheet: dict | None = None) -> dict:
    """Rank 0's all-reduce line (allreduce_worker.py), checked against ALLREDUCE and the datasheet."""
    out = ALLREDUCE.check(document, "")
    check_bounds("multinode.allreduce", out, datasheet, "")
    return out
