"""PromptSettings (trl_collm/generation/prompts.py): a saved team records everything that shaped its prompts
(agent_context, each agent's prompt limit, its chat template), and `play`, `trl-collm eval` and `load_team` give it
back, so a team is played on the very tokens it was trained on."""

from __future__ import annotations

import json
import shutil

import pytest
from datasets import Dataset

from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult, chat
from trl_collm.generation.prompts import PromptSettings, template_fingerprint
from trl_collm.inference import load_team, play, saved_prompts
from trl_collm.tasks import TaskSpec, register_task

NAMES = ["a", "b"]
ROWS = [{"prompt": "a house of four walls"}, {"prompt": "two towers and a bridge between them"}]
LIMIT = 80  # the turn-1 prompts (about 50 tokens) fit; the turn-2 histories (about 100) are cut, keeping history
# A chat template of our own, so that conversations are rendered with a template the plain rendering cannot match.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class ChatEnv(MultiAgentEnv):
    """Two turns of chat observations (ChatPrompt: templated for agents whose tokenizer has a template)."""

    agent_names = NAMES

    def reset(self, row):
        self.t = 0
        return [chat.task_prompt(f"You are {a}. Plan:", row["prompt"]) for a in NAMES]

    def step(self, completions):
        self.t += 1
        reward = [len(c) % 3 / 3 for c in completions]
        obs = [chat.task_prompt("Your partner said:", completions[1 - i]) for i in range(2)]
        return StepResult(reward=reward, observations=obs, done=self.t >= 2)


@pytest.fixture(scope="module", autouse=True)
def prompt_record_task():
    """The test's task, registered for this module only: a task left in the registry would show in other tests'
    task listings (`trl-collm tasks`, the catalogue) that run in the same worker."""
    from trl_collm import tasks

    spec = register_task(
        TaskSpec(
            name="prompt-record-test",
            description="two agents, two chat turns (tests/test_prompt_settings.py)",
            agent_names=NAMES,
            num_turns=2,
            make_env=ChatEnv,
            load_dataset=lambda split="train", limit=None: Dataset.from_list(ROWS[:limit]),
        )
    )
    yield spec
    tasks._REGISTRY.pop(spec.name, None)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, qwen_path):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("chat") / "tiny-qwen2-chat"
    shutil.copytree(qwen_path, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, chat_model):
    """A team trained with every prompt setting away from its default, saved; and training's own greedy prompts."""
    from conftest import CPU_DEFAULTS

    from trl_collm import MultiAgentPPOConfig

    out = tmp_path_factory.mktemp("trained") / "out"
    args = MultiAgentPPOConfig(
        **dict(CPU_DEFAULTS, output_dir=str(out), total_episodes=4, num_ppo_epochs=1, per_device_train_batch_size=2),
        agent_names=NAMES,
        num_turns=2,
        agent_context="history",
        max_prompt_length=LIMIT,
    )
    trainer = MultiAgentPPOTrainer(args=args, model=chat_model, train_dataset=Dataset.from_list(ROWS), env=ChatEnv())
    trainer.train()
    trainer.save_model()
    # The training path's prompts (its sampler, its runner), decoded greedily as play and eval do.
    roll = trainer.rollout(list(ROWS), greedy=True)
    prompts = {
        (int(e), t, a): turn[a].gen.query_ids[k][turn[a].gen.query_mask[k].bool()].tolist()
        for t, turn in enumerate(roll.turns)
        for a in NAMES
        for k, e in enumerate(turn[a].episode_ids)
    }
    texts = {(int(e), t, a): turn[a].contexts[k] for t, turn in enumerate(roll.turns) for a in NAMES
             for k, e in enumerate(turn[a].episode_ids)}  # fmt: skip
    return {"out": str(out), "prompts": prompts, "texts": texts}


def _played(transcripts) -> dict:
    return {
        (tr["episode"], turn["turn"], a): io["prompt_ids"]
        for tr in transcripts
        for turn in tr["turns"]
        for a, io in turn["agents"].items()
    }


def test_training_prompts_use_every_setting(trained):
    """The recorded run really is away from every default: templated, with history, cut to the limit."""
    prompts, texts = trained["prompts"], trained["texts"]
    assert len(prompts) == 2 * 2 * 2  # episodes x turns x agents, nobody stopped early
    assert all("<|assistant|>" in text for text in texts.values())  # the chat template rendered them
    assert all(texts[(e, 1, a)].count("<|user|>") == 2 for e in range(2) for a in NAMES)  # turn 2: its history
    assert all(len(ids) < LIMIT for (e, t, a), ids in prompts.items() if t == 0)
    assert all(len(ids) == LIMIT for (e, t, a), ids in prompts.items() if t == 1)  # the limit cut them all


def test_team_json_records_the_prompt_settings(trained, chat_model):
    from transformers import AutoTokenizer

    desc = json.load(open(f"{trained['out']}/team.json"))
    fingerprint = template_fingerprint(AutoTokenizer.from_pretrained(chat_model))
    assert fingerprint is not None
    assert desc["prompts"] == {
        "agent_context": "history",
        "max_prompt_length": {"a": LIMIT, "b": LIMIT},
        "chat_templates": {"a": fingerprint, "b": fingerprint},
    }
    assert saved_prompts(trained["out"]) == PromptSettings("history", {"a": LIMIT, "b": LIMIT}, desc["prompts"][
        "chat_templates"])  # fmt: skip


def test_play_reproduces_trainings_prompts_byte_for_byte(trained):
    team = load_team(trained["out"])
    assert _played(play(team, ChatEnv(), list(ROWS), num_turns=2)) == trained["prompts"]
    # the check can fail: the team prompted without either recorded setting plays other prompts at turn 2
    recorded = PromptSettings.from_team_json(team.description)
    for other in (PromptSettings("observation", recorded.max_prompt_length), PromptSettings("history")):
        played = _played(play(team, ChatEnv(), list(ROWS), num_turns=2, prompts=other))
        assert all(played[k] != trained["prompts"][k] for k in played if k[1] == 1)


def test_eval_reproduces_trainings_prompts_byte_for_byte(trained):
    from trl_collm.cli.evaluate import evaluate_team

    argv = ["--team_dir", trained["out"], "--task", "prompt-record-test", "--limit", "2"]
    _, transcripts = evaluate_team(argv)
    assert _played(transcripts) == trained["prompts"]
    _, transcripts = evaluate_team(argv, play_mode=True)
    assert _played(transcripts) == trained["prompts"]


def test_a_tokenizer_with_another_template_is_refused(trained):
    team = load_team(trained["out"])
    team.tokenizers["b"].chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"agent 'b' was trained with chat template [0-9a-f]{16} but its tokenizer"):
        play(team, ChatEnv(), list(ROWS), num_turns=2)


def test_an_older_team_json_without_the_record_still_loads_and_plays(trained, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(trained["out"], old)
    desc = json.loads((old / "team.json").read_text())
    del desc["prompts"]
    desc["generation"]["max_prompt_length"] = {"a": 10, "b": None}  # where the limits lived before the record
    (old / "team.json").write_text(json.dumps(desc))
    assert saved_prompts(str(old)) == PromptSettings("observation", {"a": 10, "b": None}, {})
    transcripts = play(load_team(str(old)), ChatEnv(), list(ROWS), num_turns=2)
    played = _played(transcripts)
    assert len(played) == 8 and all(len(played[k]) <= 10 for k in played if k[2] == "a")
    # the observation alone at turn 2: one user message, not the history
    assert all(transcripts[0]["turns"][1]["agents"][a]["prompt"].count("<|user|>") == 1 for a in NAMES)


def test_prompt_settings_refuse_bad_values():
    with pytest.raises(ValueError, match=r"agent_context must be one of \['observation', 'history'\]"):
        PromptSettings(agent_context="full")
    with pytest.raises(ValueError, match=r"max_prompt_length\['a'\] must be None or an integer >= 1, got 0"):
        PromptSettings(max_prompt_length={"a": 0})
    limits = {"a": 5}
    settings = PromptSettings(max_prompt_length=limits)
    limits["a"] = 7  # the record keeps its own copy
    assert settings.limit("a") == 5 and settings.limit("b") is None
