"""Figures of bench results: the ratios each bench prints (gpuprov against the peer measured in the same run, on
the same machine and lab hosts), drawn with matplotlib's Agg backend as a PNG beside the JSON result (same base
name, .png). Below 1 gpuprov took less than its peer; the dashed line at 1 is the peer.

    python bench/plots.py bench/results/provision-20261202T175833Z.json [...]   # figures of recorded results
    python bench/<bench>.py --plot                                               # a bench draws its own result

matplotlib is imported only when a figure is drawn (a bench without --plot never imports it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 7.0, 100   # every figure is 1000 x 700 pixels

# (label, ratio, (low, high) spread or None) in a panel; (title, bars) per panel
Bar = tuple[str, float, tuple[float, float] | None]
Panel = tuple[str, list[Bar]]


def _facts(data: dict) -> list[Panel]:
    return [("facts gather, gpuprov / plain ssh (wall)",
             [(f"{row['hosts']} hosts", row["gpuprov_s"] / row["ssh_s"], None) for row in data["rows"]])]


def _inventory(data: dict) -> list[Panel]:
    rows = data["results"]
    return [("inventory.check, seconds",
             [(f"{r['hosts']} hosts / {peer}", r["gpuprov"]["seconds"] / r[peer]["seconds"], None)
              for r in rows for peer in ("peer", "floor")]),
            ("inventory.check, peak memory / floor",
             [(f"{r['hosts']} hosts", r["gpuprov"]["peak_mb"] / r["floor"]["peak_mb"], None) for r in rows])]


def _provision(data: dict) -> list[Panel]:
    panels = []
    for phase in ("first", "noop"):
        bars = []
        for size, tools in sorted(data["results"].items(), key=lambda item: int(item[0])):
            mine = tools.get("gpuprov", {}).get(phase) or {}
            for peer, result in tools.items():
                theirs = result.get(phase) or {}
                if peer != "gpuprov" and mine.get("ok") and theirs.get("ok") and theirs.get("wall_s"):
                    bars.append((f"{size} hosts / {peer}", mine["wall_s"] / theirs["wall_s"], None))
        panels.append((f"provision {'first run' if phase == 'first' else 'no-op re-run'}, gpuprov / peer (wall)",
                       bars))
    return panels


def _validate(data: dict) -> list[Panel]:
    return [("validate (seconds)", [(what, data[key], None) for what, key in (
        ("cold / warm", "cold_per_warm"), ("warm / ssh + import torch floor", "warm_per_floor"),
        ("cold env / scp + venv + pip peer", "cold_env_per_peer")) if data.get(key)])]


def _rollout(data: dict) -> list[Panel]:
    bars = []
    for key, what in (("wall_ratio", "wall"), ("active_ratio", "without the waits for jobs"),
                      ("work_ratio", "drained -> resumed")):
        values = [found[key] for found in data["rounds"] if key in found]
        if values:
            spread = (min(values), max(values)) if len(values) > 1 else None
            bars.append((what, statistics.median(values), spread))
    rounds = len(data["rounds"])
    return [(f"rollout, gpuprov / by-hand script (median of {rounds} round{'s' * (rounds != 1)})", bars)]


def _controller_scale(data: dict) -> list[Panel]:
    panels = []
    for metric in ("wall", "cpu", "memory"):
        groups: dict[tuple[int, int], list[float]] = {}
        for row in data["ratios"]:
            groups.setdefault((row["hosts"], row["width"]), []).append(row[f"{metric}_gpuprov_over_ssh"])
        panels.append((f"controller, {metric}: gpuprov / one ssh per host (both orders)",
                       [(f"{hosts} hosts, width {width}", statistics.median(values),
                         (min(values), max(values)) if len(values) > 1 else None)
                        for (hosts, width), values in sorted(groups.items())]))
    return panels


def _images(data: dict) -> list[Panel]:
    results = data["results"]
    rebuild = results["rebuild_no_change"]
    return [(f"images.build, gpuprov / docker build ({data.get('rounds', '?')} paired rounds)", [
        (what, row[key], tuple(row[f"{key}_spread"]) if row.get(f"{key}_spread") else None)
        for what, row, key in (("no-change rebuild", rebuild, "ratio"),
                               ("no-change rebuild, --parallel 1", rebuild, "ratio_one_at_a_time"),
                               ("--changed-only, no change", results.get("changed_only_no_change") or {}, "ratio"),
                               ("--changed-only, one change", results.get("changed_only_one_change") or {}, "ratio"))
        if row.get(key) is not None])]


KINDS: dict[str, Callable[[dict], list[Panel]]] = {
    "facts": _facts, "inventory": _inventory, "provision": _provision, "validate": _validate,
    "rollout": _rollout, "controller_scale": _controller_scale, "images": _images}


def panels(path: Path) -> list[Panel]:
    """The ratios of one result file, by its kind (the file name up to the last `-`: provision-<stamp>.json)."""
    kind = path.name.rsplit("-", 1)[0]
    if kind not in KINDS:
        raise ValueError(f"{path.name}: not a result of {', '.join(sorted(KINDS))}")
    return [(title, bars) for title, bars in KINDS[kind](json.loads(path.read_text(encoding="utf-8"))) if bars]


def plot_result(path: str | Path) -> Path:
    """Draw the result at `path` as `path` with .png; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    path = Path(path)
    found = panels(path)
    if not found:
        raise ValueError(f"{path.name}: none of the ratios its bench writes today (an older result, or every "
                         "measured run failed)")
    figure, axes = pyplot.subplots(len(found), 1, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, squeeze=False,
                                   height_ratios=[max(len(bars), 1) + 1 for _, bars in found])
    for ax, (title, bars) in zip(axes[:, 0], found, strict=True):
        labels = [label for label, _, _ in bars]
        values = [value for _, value, _ in bars]
        ax.barh(labels, values, color=["#2a9d8f" if value <= 1 else "#e76f51" for value in values])
        for y, (_, value, spread) in enumerate(bars):   # the spread of the rounds, where there were several
            if spread:
                ax.errorbar(value, y, xerr=[[value - spread[0]], [spread[1] - value]], fmt="none", ecolor="black",
                            capsize=3)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlim(0, max([*values, *(spread[1] for _, _, spread in bars if spread), 1.0]) * 1.2)
        for y, (_, value, spread) in enumerate(bars):   # the figure right of its bar and its spread
            ax.annotate(f"{value:.2f}", (max(value, spread[1]) if spread else value, y), xytext=(5, 0),
                        textcoords="offset points", va="center", fontsize=8)
        ax.tick_params(labelsize=8)
    figure.suptitle(f"{path.stem}: ratio against the peer of the same run (< 1: gpuprov faster or smaller)",
                    fontsize=11)
    figure.tight_layout()
    out = path.with_suffix(".png")
    figure.savefig(out, format="png")
    pyplot.close(figure)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench/results/<bench>-<stamp>.json files")
    args = parser.parse_args()
    failed = 0
    for path in args.results:
        try:
            print(f"wrote {plot_result(path)}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: cannot plot: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
