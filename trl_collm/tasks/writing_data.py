"""The writing tasks' data: ``load_posts`` (``writing-summary``) and ``load_abstracts`` (``writing-intro``), from the
offline sample shipped in ``tasks/data/`` or from a Hugging Face dataset, split into train / eval by a hash of each
row's text (``EVAL_PERCENT`` of the rows held out). ``writing.py`` registers the tasks with these loaders.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from importlib import resources

__all__ = ["load_posts", "load_abstracts", "EVAL_PERCENT", "COLUMNS"]

EVAL_PERCENT = 10
COLUMNS = ("id", "topic", "title", "document")
_SPLITS = ("train", "eval")
# Text columns tried, in order, when an HF dataset is given without text_column=.
_TEXT_COLUMNS = {
    "writing-summary": ("document", "post", "prompt", "text", "content", "body", "article"),
    "writing-intro": ("document", "abstract", "text", "content", "body", "article"),
}
# trl-lib/tldr's prompt: "SUBREDDIT: r/x\n\nTITLE: t\n\nPOST: p\n\nTL;DR:" -> title t, document p.
_TLDR_RE = re.compile(
    r"^\s*SUBREDDIT:\s*(?P<forum>\S*)\s*TITLE:\s*(?P<title>.*?)\s*POST:\s*(?P<post>.*?)\s*(?:TL;DR:\s*)?$", re.S
)


def _is_eval(document: str) -> bool:
    """Deterministic per-row split: a row's bucket depends on its text only, so adding rows never moves others."""
    bucket = int(hashlib.sha256(document.encode("utf-8")).hexdigest()[:8], 16) % 100
    return bucket < EVAL_PERCENT


@functools.cache
def _offline_rows(filename: str) -> tuple[dict, ...]:
    path = resources.files(__package__).joinpath("data", filename)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}, line {number}: not valid JSON ({e}); the shipped task data is damaged, reinstall trl-collm."
            ) from None
    return tuple(rows)


def _check_args(task: str, split: str, limit) -> None:
    if split not in _SPLITS:
        raise ValueError(f"{task}: split must be one of {_SPLITS}, got {split!r}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"{task}: limit must be None or an int >= 0, got {limit!r}.")


def _from_hub(task: str, split: str, source: str, text_column: str | None, title_column: str | None) -> list[dict]:
    import datasets

    try:
        loaded = datasets.load_dataset(source)
    except Exception as err:  # offline, unknown name, gated: all end the same way for the user
        raise RuntimeError(
            f"{task}: could not load source={source!r} with datasets.load_dataset ({type(err).__name__}: {err}). "
            f"A dataset name needs network access (or a copy in the local Hugging Face cache); "
            f"use source=None for the offline sample shipped with trl_collm."
        ) from err
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if split == "train" and "train" in loaded:
            table, hash_split = loaded["train"], False
        elif split == "eval" and ("validation" in loaded or "test" in loaded):
            table, hash_split = loaded["validation" if "validation" in loaded else "test"], False
        elif "train" in loaded and split == "eval":
            table, hash_split = loaded["train"], True  # no held-out split: carve one out of train
        else:
            table, hash_split = loaded[names[0]], True
    else:
        table, hash_split = loaded, True

    columns = list(table.column_names)
    candidates = (text_column,) if text_column else _TEXT_COLUMNS[task]
    text_col = next((c for c in candidates if c in columns), None)
    if text_col is None:
        raise ValueError(
            f"{task}: source={source!r} has columns {columns}; none is a text column "
            f"({'text_column=' + repr(text_column) if text_column else 'tried ' + str(list(candidates))}). "
            f"Pass text_column='<column with the source text>'."
        )
    if title_column and title_column not in columns:
        raise ValueError(f"{task}: title_column={title_column!r} is not a column of {source!r} ({columns}).")
    title_col = title_column or ("title" if "title" in columns else None)

    rows = []
    for i, rec in enumerate(table):
        text = rec[text_col]
        if not isinstance(text, str) or not text.strip():
            continue
        title = str(rec[title_col] or "") if title_col else ""
        topic = source
        match = _TLDR_RE.match(text) if text.lstrip().startswith("SUBREDDIT:") else None
        if match:
            text, title, topic = match["post"], title or match["title"], match["forum"] or source
        rows.append({"id": f"{source}:{i}", "topic": topic, "title": title, "document": text.strip()})
    if hash_split:
        rows = [r for r in rows if _is_eval(r["document"]) == (split == "eval")]
    return rows


def _load(task: str, filename: str, split: str, source, limit, text_column, title_column):
    from datasets import Dataset

    _check_args(task, split, limit)
    if source is None:
        rows = [dict(r) for r in _offline_rows(filename) if _is_eval(r["document"]) == (split == "eval")]
    else:
        rows = _from_hub(task, split, source, text_column, title_column)
    if limit is not None:
        rows = rows[:limit]
    return Dataset.from_dict({c: [r[c] for r in rows] for c in COLUMNS})


def load_posts(
    split: str = "train",
    source: str | None = None,
    limit: int | None = None,
    text_column: str | None = None,
    title_column: str | None = None,
):
    """Posts for ``writing-summary`` as a ``datasets.Dataset`` with columns id, topic, title, document.

    ``source=None``: the offline sample shipped with the package (197 posts: 111 train, 86 eval). Otherwise an HF
    dataset name (needs network), e.g. ``"trl-lib/tldr"``; ``text_column`` names its text column (default: the first of
    document/post/prompt/text/content/body/article), and tl;dr-style prompts are split into title and post.
    """
    return _load("writing-summary", "writing_posts.jsonl", split, source, limit, text_column, title_column)


def load_abstracts(
    split: str = "train",
    source: str | None = None,
    limit: int | None = None,
    text_column: str | None = None,
    title_column: str | None = None,
):
    """Abstracts for ``writing-intro``; as :func:`load_posts` (default text columns: document/abstract/text/...)."""
    return _load("writing-intro", "writing_abstracts.jsonl", split, source, limit, text_column, title_column)
