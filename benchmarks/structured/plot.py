"""The throughput PNG (``e2e_structured.png``), drawn from a throughput report.

Pure (no engine): works on a report just built or on a results JSON already written.
"""

from __future__ import annotations

import pathlib
from typing import Any

COLORS = {
    "none": "#9e9e9e",
    "ours": "#ff7f0e",
    "ours_strict": "#ffbb78",
    "ours_xgrammar": "#d62728",
    "vllm": "#1f77b4",
    "vllm_ws": "#aec7e8",
}
# (summary key, y label) of the three panels.
PANELS = (
    ("requests_per_s", "requests/s"),
    ("tokens_per_s", "output tokens/s"),
    ("step_ms_at_3_4_batch", "ms per step at 3/4 batch running (fit)"),
)


def plot_throughput(report: dict[str, Any], path: pathlib.Path) -> None:
    """Bars (median of the rounds) and dots (each round) per configuration; nothing if empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    if not summary:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for i, s in enumerate(summary):
            values = [v for v in s[f"{key}_all"] if v is not None]
            if not values:
                continue
            ax.bar(i, s[f"{key}_median"], 0.6, color=COLORS.get(s["config"], "#777777"))
            ax.plot([i] * len(values), values, "k.", markersize=5)
            note = f"{s[f'{key}_median']:.1f}"
            if s["config"] != "none" and key != "step_ms_at_3_4_batch":
                note += f"\nvalid {s['valid_all_share_median']:.0%}"
                note += f"\nstop {s['finished_stop_share_median']:.0%}"
            ax.text(i, s[f"{key}_median"], note, ha="center", va="bottom", fontsize=8)
        top = max((v for s in summary for v in s[f"{key}_all"] if v is not None), default=1)
        ax.set_ylim(0, top * 1.3)
        ax.set_xticks(range(len(summary)), [s["config"] for s in summary])
        ax.set_ylabel(label)
    settings, machine = report["settings"], report["machine"]
    fig.suptitle(
        f"JSON schema, {settings['batch']} MaskBench schemas x {settings['tokens']} max tokens, "
        f"T=1, {settings['rounds']} rounds; {machine['cpu_model']} x{machine['cpu_cores']}, "
        f"vLLM {machine['vllm']}\nbars: median of the rounds; dots: each round",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
