"""The report of `exaplan data pairs` (or of a pairs directory's manifest) as a table."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from runtime.dataprep.pairs import FORMAT, FORMAT_VERSION, SPLITS, load_manifest


def _num(x: float | None, width: int = 9) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.3g}"


def format_report(rep: dict[str, Any]) -> str:
    """The report of `build_pairs` (or a manifest) as a table."""
    src, rows = rep["source"], rep["rows"]
    cols = ", ".join(f"{k} {v!r}" for k, v in rep["columns"].items() if v is not None)
    how = (f"margin {rep['margin']:g}, up to {rep['pairs_per_sequence']} partner(s) per sequence"
           if rep["mode"] == "scored" else "explicit pairs (no margin)")
    if rep.get("max_pairs"):
        how += f", at most {rep['max_pairs']:,} pairs per split"
    lines = [f"{src['path']} ({src['rows']:,} rows, sha256 {src['sha256'][:16]}...)"
             + (f" -> {rep['out_dir']}" if "out_dir" in rep else ""),
             f"columns: {cols}; {how}; seed {rep['seed']}; max_len {rep['max_len']}",
             f"split rule: {rep['split_rule']}" + (f" (val_fraction {rep['val_fraction']:g})"
                                                   if rep.get("val_fraction") is not None else ""),
             "",
             f"{'split':<11}{'rows':>10}{'dropped':>9}{'sequences':>11}{'pairs':>11}"
             f"{'diff min':>10}{'median':>9}{'max':>9}"]
    total = Counter()
    for s in SPLITS:
        d = rep["difference_stats"][s] or {}
        dropped = sum(rows["dropped_per_split"][s].values())
        lines.append(f"{s:<11}{rows['per_split'][s]:>10,}{dropped:>9,}{rep['sequences'][s]:>11,}"
                     f"{rep['counts'][s]:>11,}{_num(d.get('min'), 10)}{_num(d.get('median'))}{_num(d.get('max'))}")
        total.update(rows=rows["per_split"][s], dropped=dropped, sequences=rep["sequences"][s], pairs=rep["counts"][s])
    lines.append(f"{'total':<11}{total['rows']:>10,}{total['dropped']:>9,}{total['sequences']:>11,}{total['pairs']:>11,}")
    lines.append("")
    dropped = ", ".join(f"{k} {v:,}" for k, v in rows["dropped"].items() if v) or "none"
    lines.append(f"rows dropped: {dropped}")
    for ex in rep.get("dropped_examples", [])[:8]:
        lines.append(f"  line {ex['line']}: {ex['reason']} ({ex['detail']})")
    lines.append(f"pairs dropped for identical sequences: {rep['identical_pairs_dropped']:,}"
                 + (" (duplicate sequences are dropped before pairing)" if rep["mode"] == "scored" else ""))
    if rep["counts"]["validation"] == 0:
        lines.append("note: no validation pairs")
    if "seconds" in rep:
        lines.append(f"{rep['seconds']:.1f} s")
    return "\n".join(lines)


def describe_pairs(pairs_dir: str | os.PathLike) -> str:
    """A few lines about a pairs directory."""
    m = load_manifest(pairs_dir)
    return f"{os.path.abspath(pairs_dir)}: {FORMAT} v{FORMAT_VERSION}\n" + format_report(m)
