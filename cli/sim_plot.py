"""`kvcalc sim --plot`: the KV pool's breakdown over time (one panel per policy) and latency CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.sim.metrics import latencies
from ..core.sim.policies import MEMORY_PARTS

_COLORS = ("#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#dddddd")


def write_sim_plot(path: Path, records: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    names = list(records)
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(10, 2.6 * (len(names) + 1)), squeeze=False)
    for ax, name in zip(axes[:-1, 0], names, strict=True):
        rows = np.array([r[:4 + len(MEMORY_PARTS)] for r in records[name].timeline], dtype=float)
        if len(rows):
            capacity = records[name].capacity_slots
            t = rows[:, 0]
            shares = rows[:, 4:].T / capacity
            ax.stackplot(t, shares, labels=[p.replace("_", " ") for p in MEMORY_PARTS], colors=_COLORS,
                         step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of KV pool")
        ax.set_title(f"{name}: KV pool over time (s)", fontsize=9)
        ax.legend(loc="upper right", fontsize=6, ncol=3)
    ax = axes[-1, 0]
    for name in names:
        lat = latencies(records[name])
        for key, style in (("ttft_s", "-"), ("e2e_s", "--")):
            values = np.sort(getattr(lat, key)[lat.completed])
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=f"{name} {key[:-2].upper()}")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (step-time model)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=6, ncol=2)
    axes[-1, 0].set_title("latency CDFs (completed requests)", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
