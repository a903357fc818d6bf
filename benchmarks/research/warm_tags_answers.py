"""What a writing-tags warm start writes: each tagger's answers on the held-out posts, sorted into own tag,
teammate's tag, another tag of the task, or no tag (a fragment such as `legaladv`), for several SFT recipes.

This is the diagnosis behind the writing-tags recipe (docs/warm_start.md): the old recipe's model sampled at
temperature 1 mostly wrote other tags and fragments, although greedy it copied one of its prompt's two tags.

    python benchmarks/research/warm_tags_answers.py                      # the three recipes of the docs' table (~4 min)
    python benchmarks/research/warm_tags_answers.py --recipes new --repeats 8

Warm starts go to WARM_ROOT/<recipe> (reused when the fingerprint matches, as everywhere).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name -> (WarmStartConfig overrides of the writing-tags recipe, label)
RECIPES = {
    "old": (dict(episodes=800, epochs=2.0, noise=dict(own=0.4, other=0.3, random=0.3)), "800 x 2, noise 0.4/0.3/0.3"),
    "less-noise": (dict(episodes=800, epochs=2.0), "800 x 2, noise 0.45/0.45/0.1"),
    "new": ({}, "the default: 2,000 x 3, noise 0.45/0.45/0.1"),
}
KINDS = ("own", "teammate", "both", "another tag", "no tag")


def answer_kinds(rows, texts) -> dict[str, Counter]:
    """Per tagger, a count of its answers by kind; `texts[k][i]` is tagger i's answer to rows[k]."""
    from trl_collm.tasks import get_task
    from trl_collm.tasks.tags import AGENT_NAMES, tags_of, word_set  # (importing it registers the task)

    task = get_task("writing-tags")
    known = {t for split in ("train", "eval") for r in task.load_dataset(split) for t in tags_of(r).values()}
    out = {a: Counter() for a in AGENT_NAMES}
    for row, answers in zip(rows, texts):
        tags = tags_of(row)
        for i, agent in enumerate(AGENT_NAMES):
            words = word_set(answers[i])
            own, mate = tags[agent] in words, tags[AGENT_NAMES[1 - i]] in words
            kind = "both" if own and mate else "own" if own else "teammate" if mate else None
            out[agent][kind or ("another tag" if words & known else "no tag")] += 1
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--warm-root", default="/tmp/trl_collm_warm_tags_answers")
    p.add_argument("--repeats", type=int, default=4, help="samples of every held-out post")
    p.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.0])
    p.add_argument("--seed", type=int, default=1234, help="the sampling seed (warm_findings.py's EVAL_SEED)")
    a = p.parse_args()
    import torch

    import trl_collm.tasks.tags  # noqa: F401  (registers the task)
    from trl_collm.tasks import get_task
    from trl_collm.warmstart import WarmStartConfig, make_warm_start, rollout_team

    torch.set_num_threads(1)
    rows = [dict(r) for r in get_task("writing-tags").load_dataset("eval") for _ in range(a.repeats)]
    print(f"{len(rows)} episodes: the held-out posts x {a.repeats}; rates per tagger (forum / subject)")
    print("| recipe | temperature | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for name in a.recipes:
        overrides, label = RECIPES[name]
        cfg = WarmStartConfig.for_task("writing-tags", **overrides)
        path = make_warm_start(os.path.join(a.warm_root, name), cfg, progress=False)
        for temperature in a.temperatures:
            _, roll = rollout_team(
                path, rows, task="writing-tags", temperature=temperature, max_new_tokens=16, seed=a.seed
            )
            texts = list(zip(*(roll.turns[0][n].gen.texts for n in roll.agent_names)))
            kinds = answer_kinds(rows, texts)
            cells = [" / ".join(f"{kinds[t][k] / len(rows):.2f}" for t in kinds) for k in KINDS]
            print(f"| {name}: {label} | {temperature:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
