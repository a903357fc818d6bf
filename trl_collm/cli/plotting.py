"""Learning-curve plots (matplotlib is an optional extra: `pip install 'trl-collm[plot]'`)."""

from __future__ import annotations


def curve_title(task: str, kind: str, critic_title: str | None) -> str:
    """e.g. 'coord-penalty: ppo (CoLLM-CC, centralized critic)', 'coord-penalty: mc (no critic)'; `critic_title` is
    what the critic layout says of itself (`TeamCritic.describe()`), None without a critic."""
    return f"{task}: {kind} ({critic_title or 'no critic'})"


def plot_learning_curve(
    history: list[dict], path: str, title: str = "", window: int = 5, x: str = "episode", y: str = "score"
) -> str:
    """Plot `y` against `x` (raw points and a moving average) and save a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [h[x] for h in history]
    ys = [h[y] for h in history]
    smooth = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, ys, ".", alpha=0.35, label=y)
    ax.plot(xs, smooth, "-", label=f"moving mean ({window})")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # a title wider than the axes stays in the picture
    plt.close(fig)
    return path
