"""Training curves from a `metrics.jsonl` written by the CLI: GRPO (reward per function, KL, completion length) or
DPO/ORPO/KTO (loss, implicit rewards and margin, pair accuracy).

Choices made: matplotlib's Agg backend (no display needed); one figure with three panels sharing the step axis;
a metric that was never logged (KL when beta=0) is drawn as an empty panel with a note instead of failing.
"""

from __future__ import annotations

import json
import math


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(row.get("step", len(xs)))
            ys.append(float(value))
    return xs, ys


def grpo_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    reward_keys = sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    return [
        ("reward", ["reward"] + reward_keys),
        ("KL", ["kl"]),
        ("completion length (tokens)", ["completions/mean_length"]),
    ]


def preference_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    # DPO/ORPO/KTO log implicit rewards of the chosen and rejected answers, their margin and the pair accuracy
    return [
        ("loss", ["loss", "nll_loss"]),
        ("implicit reward", ["rewards/chosen", "rewards/rejected", "rewards/margins"]),
        ("pair accuracy", ["rewards/accuracies"]),
    ]


def plot_metrics(metrics_path: str, png_path: str, panels=grpo_panels) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    panels = panels(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, keys) in zip(axes, panels):
        drawn = False
        for key in keys:
            xs, ys = _series(rows, key)
            if xs:
                label = "total" if key == "reward" else key.removeprefix("rewards/").removesuffix("/mean")
                label = "nll" if key == "nll_loss" else label
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        elif len(keys) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
