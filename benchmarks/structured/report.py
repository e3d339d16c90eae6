"""Results of both subcommands: summaries, console tables and the JSON files.

Pure (no engine, no vLLM): everything here works from the records the runs produce, or from a
results JSON already written (``report["runs"]``, ``report["schemas"]``).
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys
from typing import Any

from benchmarks.common import median
from benchmarks.structured.configs import OURS_EXTRA
from benchmarks.structured.outcomes import outcome_summary

# Per-run values the throughput summary keeps, each as a median and as every round's value.
SUMMARY_KEYS = (
    "requests_per_s",
    "tokens_per_s",
    "seconds",
    "cold_seconds",
    "cold_admission_s",
    "cold_steps_s",
    "startup_s",
    "output_tokens",
    "mean_output_tokens",
    "step_ms_at_3_4_batch",
    "finished_stop_share",
    "valid_all_share",
)
# Median values of our configurations that also get a ratio to vLLM's (``KEY_over_vllm``).
RATIO_KEYS = ("requests_per_s", "tokens_per_s", "step_ms_at_3_4_batch", "cold_seconds")


def write_json(path: pathlib.Path, report: dict[str, Any]) -> None:
    """``report`` as indented JSON with a final newline."""
    path.write_text(json.dumps(report, indent=2) + "\n")


# ---- throughput ---------------------------------------------------------------------------


def throughput_summary(runs: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    """One entry per configuration with a successful run: medians, every round, ratios."""
    summary = []
    for config in configs:
        ok = [r for r in runs if r["config"] == config and "error" not in r]
        if not ok:
            continue
        entry: dict[str, Any] = {"config": config, "rounds": len(ok)}
        for key in SUMMARY_KEYS:
            values = [r[key] for r in ok]
            known = [v for v in values if v is not None]
            entry[f"{key}_median"] = median(known) if known else None
            entry[f"{key}_all"] = values
        shares = [r["valid_among_finished_share"] for r in ok]
        entry["valid_among_finished_share_all"] = shares
        known = [s for s in shares if s is not None]
        entry["valid_among_finished_share_min"] = min(known) if known else None
        summary.append(entry)
    by = {s["config"]: s for s in summary}
    for name in OURS_EXTRA:
        if name not in by or "vllm" not in by:
            continue
        for key in RATIO_KEYS:
            ours, vllm = by[name][f"{key}_median"], by["vllm"][f"{key}_median"]
            by[name][f"{key}_over_vllm"] = ours / vllm if ours and vllm else None
    return summary


def print_round(record: dict[str, Any]) -> None:
    """One line on stderr for a successful run."""
    print(
        f"round {record['round']} {record['config']:8s}: {record['requests_per_s']:6.2f} req/s "
        f"{record['tokens_per_s']:7.1f} tok/s  stop {record['finished_stop']}"
        f"/{record['requests']}  valid {record['valid_among_finished']}"
        f"  step@3/4 {record['step_ms_at_3_4_batch']:.1f} ms",
        file=sys.stderr,
        flush=True,
    )


def print_throughput_summary(summary: list[dict[str, Any]]) -> None:
    """One line per configuration: the medians over rounds."""
    for s in summary:
        print(
            f"{s['config']:8s} median {s['requests_per_s_median']:6.2f} req/s "
            f"{s['tokens_per_s_median']:7.1f} tok/s  stop {s['finished_stop_share_median']:.0%}"
            f"  valid/finished {s['valid_among_finished_share_min']}"
            f"  valid/all {s['valid_all_share_median']:.0%}"
            f"  step@3/4 {s['step_ms_at_3_4_batch_median']:.1f} ms"
        )


# ---- validity -----------------------------------------------------------------------------


def validity_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Admission and outcome counts over per-schema validity records."""
    admitted = [r for r in records if not r["refused"]]
    summary = outcome_summary(admitted) if admitted else {"requests": 0}
    summary.pop("requests", None)
    return {
        "submitted": len(records),
        "refused": len(records) - len(admitted),
        "refused_reasons": dict(
            collections.Counter(r["reason_first_words"] for r in records if r["refused"])
        ),
        "admitted": len(admitted),
        "backends": dict(collections.Counter(r.get("backend") for r in admitted)),
        **summary,
    }


def print_validity(report: dict[str, Any]) -> None:
    """The per-split table, then every output that finished but is not valid."""
    print(f"{'split':16s} submitted refused stop valid/stop")
    for s in [*report["splits"], {"split": "TOTAL", **report["totals"]}]:
        print(
            f"{s['split']:16s} {s['submitted']:9d} {s['refused']:7d} "
            f"{s.get('finished_stop', 0):4d} {s.get('valid_among_finished', 0):5d}"
        )
    bad = report["finished_but_invalid"]
    print(f"finished with stop but not valid: {len(bad)}")
    for r in bad:
        print(
            f"  {r['file']} [{r.get('backend')}]: {r['status']}: {r['detail']}\n    {r['text']!r}"
        )
