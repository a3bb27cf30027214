"""Waste against block size: plain unicode bars for the terminal, a matplotlib figure for files.

Both take values already computed by core; they only scale them to bar lengths and draw them.
"""

from __future__ import annotations

from pathlib import Path

_EIGHTHS = " ▏▎▍▌▋▊▉"  # index k = k/8 of a cell
PLOT_SUFFIXES = (".png", ".svg")
PLOT_INSTALL_HINT = "pip install 'kvcalc[plot]'"


def bar(value: int, largest: int, width: int) -> str:
    """A bar of `width` * value / largest cells, to the nearest eighth of a cell."""
    if largest <= 0 or value <= 0:
        return ""
    eighths = max(1, round(8 * width * value / largest))  # a non-zero value always shows
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def bar_chart(title: str, labels: list[str], values: list[int], annotations: list[str], width: int = 40) -> str:
    """Rows `label │bar  annotation`, the longest bar `width` cells wide; returns the chart as text."""
    largest = max(values, default=0)
    label_width = max((len(label) for label in labels), default=0)
    lines = [title]
    for label, value, note in zip(labels, values, annotations, strict=True):
        lines.append(f"{label:>{label_width}} │{bar(value, largest, width):<{width}} {note}")
    return "\n".join(lines)


def check_plot_target(path: Path) -> None:
    """Fail before any work when the figure cannot be written: wrong suffix or no matplotlib."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--plot {path}: write a .png or .svg file (e.g. --plot waste.png)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"--plot needs matplotlib, which is not installed: {PLOT_INSTALL_HINT}") from None
    from .options import check_output_path

    check_output_path("--plot", path, "the figure")


def write_waste_plot(
    path: Path,
    title: str,
    block_sizes: list[int],
    waste_tokens: list[int],
    utilization: list[float],
    held: tuple[str, list[int], list[int]] | None = None,
) -> None:
    """Waste (token positions) and utilisation against block size, log2 x axis; .png or .svg by suffix.
    `held` (with a model): (the model's name, the bytes held at each block size, the block each is paged at)
    replaces the token-position waste panel, and `utilization` is then the share of those bytes that hold KV
    or state, since a layout may page at another block than the one asked for (a Mamba hybrid: 16 -> 4,128).

    Fixed reservation is left to the title: its waste is usually orders of magnitude larger and would
    flatten the paged curve to zero.
    """
    check_plot_target(path)
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, (ax_waste, ax_util) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    if held is None:
        ax_waste.plot(block_sizes, waste_tokens, marker="o")
        ax_waste.set_ylabel("tail-block waste (token positions)")
    else:
        name, held_bytes, used = held
        ax_waste.plot(block_sizes, [b / 2**30 for b in held_bytes], marker="o", color="tab:red")
        ax_waste.set_ylabel(f"{name}: GiB held (KV, state, block tables)")
        for b, h, u in zip(block_sizes, held_bytes, used, strict=True):
            if u != b:
                ax_waste.annotate(f"→ {u:,}", (b, h / 2**30), fontsize="x-small", textcoords="offset points",
                                  xytext=(0, 6), ha="center")
    ax_util.plot(block_sizes, [100 * u for u in utilization], marker="o", color="tab:green")
    ax_util.set_ylabel("position utilisation (%)" if held is None else "useful share of the bytes held (%)")
    for ax in (ax_waste, ax_util):
        ax.set_xscale("log", base=2)
        ax.set_xticks(block_sizes, [str(b) for b in block_sizes])
        ax.set_xlabel("block size B (tokens)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    fig.savefig(path)
    plt.close(fig)
