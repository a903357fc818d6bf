"""writing-revise: writing-summary over two turns, paid at the end only (trl_collm/tasks/writing_revise.py). Its
trainer runs (CC and DC over both turns) are test_task_writing.py's test_trainer_runs_on_task."""

from __future__ import annotations

import pytest

from trl_collm.chat import ChatPrompt
from trl_collm.tasks import get_task, list_tasks
from trl_collm.tasks import writing as W
from trl_collm.tasks.writing_revise import RevisionEnv

CONCISE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen."  # 16


def test_registered_as_a_two_turn_writing_summary():
    assert "writing-revise" in list_tasks()
    spec = get_task("writing-revise")
    assert spec.agent_names == ["concise", "detailed"] and spec.num_turns == 2 and spec.max_reward == 3.0
    env = spec.make_env()
    assert env.agent_names == ["concise", "detailed"] and env.max_turns == 2
    # the same posts as writing-summary
    assert list(spec.load_dataset("eval")) == list(get_task("writing-summary").load_dataset("eval"))


def test_draft_is_unpaid_and_the_revision_shows_both_drafts_with_their_counts():
    spec = get_task("writing-revise")
    rows = list(spec.load_dataset("train"))[:2]
    env = spec.make_env()
    obs = env.reset_batch(rows, 2, spec.agent_names)
    first = get_task("writing-summary").make_env().reset_batch(rows, 2)
    assert [list(o) for o in obs] == [list(o) for o in first]  # turn 1 is writing-summary's
    detailed = "word " * 70
    step = env.step_batch([[CONCISE, detailed], ["", ""]], [0, 1], 2, spec.agent_names)
    assert step.rewards.abs().sum().item() == 0.0 and not bool(step.dones.any())
    concise_obs, detailed_obs = step.observations[0]
    assert isinstance(concise_obs, ChatPrompt)
    note = concise_obs.messages[-1]["content"]
    assert "Your draft has 16 words; your window is 15 to 40 words" in note
    assert "wrote 70 words" in note and detailed.strip() in note
    assert concise_obs.messages[-2] == {"role": "assistant", "content": CONCISE}
    assert concise_obs.messages[:-2] == first[0][0].messages  # the turn-1 conversation, then draft and note
    assert "Your draft has 70 words; your window is 60 to 120 words" in detailed_obs.messages[-1]["content"]
    assert step.infos[0]["words"] == [16, 70]


def test_the_final_texts_are_scored_as_writing_summary_scores_them():
    spec = get_task("writing-revise")
    row = list(spec.load_dataset("train"))[0]
    env = spec.make_env()
    env.reset_batch([row], 2)
    env.step_batch([["a draft", "another draft"]], [0], 2)
    final = [CONCISE, " ".join(["because"] + [f"w{i}" for i in range(64)])]
    step = env.step_batch([final], [0], 2)
    expected = W.score_pair(final[0], final[1], row["document"], W.SUMMARY_RULES).total
    assert bool(step.dones.all()) and step.observations == [None]
    assert step.rewards[0].tolist() == pytest.approx([expected, expected])  # joint: both agents get it
    assert step.infos[0]["score"] == pytest.approx(expected) and expected > 0


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="num_turns must be >= 2"):
        RevisionEnv(num_turns=1)
    with pytest.raises(ValueError, match="rules.parts"):
        RevisionEnv(rules=W.INTRO_RULES)
    env = RevisionEnv()
    with pytest.raises(ValueError, match="no 'document'"):
        env.reset({"title": "x"})
    with pytest.raises(RuntimeError, match="before reset"):
        RevisionEnv().step(["a", "b"])


def test_plain_formatters_give_plain_revisions():
    env = RevisionEnv(formatters={"concise": lambda r: "Write short:", "detailed": lambda r: "Write long:"})
    env.reset({"document": "a post"})
    result = env.step(["short text", "long text"])
    assert not isinstance(result.observations[0], ChatPrompt)
    assert result.observations[0].startswith("Write short:\nshort text\n\nYour draft has 2 words")
