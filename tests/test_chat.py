"""Conversational prompts (trl_collm/chat.py): each agent renders messages with its own chat template, stops at the
template's end-of-turn token and hands on text without it; the built-in tasks' chat forms; conversational datasets
through the PPO and MC trainers. The real-model tests use SmolLM2-135M-Instruct (ChatML, `<|im_end|>` = eos = pad)
and stay tiny: a few rows, 8-16 new tokens."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from conftest import RUN_SETTINGS
from datasets import Dataset

from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOTrainer, chat
from trl_collm.chat import history_context

IM_END = "<|im_end|>"
QUESTIONS = [
    [{"role": "user", "content": "Is the sky blue? Answer with one word."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}],
]


def word_count_reward(prompts, completions, **_):
    return [[float(len(c.split())) for c in row] for row in completions]


@pytest.fixture(scope="module")
def smol_tok(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def smol_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


def template_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def plain_tokenizer():
    from trl_collm.testing import build_tokenizer

    return build_tokenizer()


# ------------------------------------------------------------------------------------------------ rendering
def test_rendered_prompts_equal_apply_chat_template(smol_tok):
    from trl_collm.team.agents import AgentTeam

    team = AgentTeam(["smol"], {"smol": smol_tok}, policies={"smol": torch.nn.Linear(1, 1)})
    prompts = [chat.agent_prompt(smol_tok, m) for m in QUESTIONS]
    for prompt, messages in zip(prompts, QUESTIONS):
        assert prompt == smol_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert prompt.endswith("<|im_start|>assistant\n")
    ids, mask = team.encode("smol", prompts, "cpu")
    for row, m, messages in zip(ids, mask, QUESTIONS):
        assert row[m.bool()].tolist() == template_ids(smol_tok, messages)  # no extra bos, nothing lost


def test_plain_strings_are_never_templated_and_a_plain_tokenizer_joins_the_contents(smol_tok):
    assert chat.agent_prompt(smol_tok, "raw text") == "raw text"  # as TRL: only conversations are templated
    assert chat.agent_prompt(smol_tok, [5, 6]) == [5, 6]
    plain = plain_tokenizer()
    assert not chat.has_template(plain)
    assert chat.agent_prompt(plain, QUESTIONS[1]) == "You are terse.\nName three colours."
    # The plain rendering of a conversation is the text a plain multi-turn history builds.
    convo = [
        {"role": "user", "content": "o0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "o1"},
    ]
    assert chat.render(plain, convo) == history_context(["o0", "o1"], ["a0"])


def test_chat_prompt_is_its_plain_text_and_keeps_its_chat_form_through_copies(smol_tok):
    p = chat.task_prompt("Be brief.", "Post: hello")
    assert p == "Be brief. Post: hello" and isinstance(p, str)
    for q in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert q == p and q.messages == p.messages
    assert chat.agent_prompt(plain_tokenizer(), p) == "Be brief. Post: hello"
    assert chat.agent_prompt(smol_tok, p) == smol_tok.apply_chat_template(
        chat.system_user("Be brief.", "Post: hello"), tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(ValueError, match=r"ChatPrompt messages\[0\] needs a str 'role' and a str 'content'"):
        chat.ChatPrompt("x", [{"role": "user", "content": None}])


def test_multi_turn_history_is_the_conversation_so_far(smol_tok):
    """agent_context='history': the turn-2 prompt is the past observations with the agent's own answers as assistant
    messages, rendered with its template; a plain agent gets the joined texts as before."""
    from trl_collm.rollout import _prompts_for

    class Team:
        names = ["smol", "plain"]
        tokenizers = {"smol": smol_tok, "plain": plain_tokenizer()}

        def decode_observation(self, name, obs):
            return obs if isinstance(obs, str) else self.tokenizers[name].decode(obs)

    first = chat.task_prompt("You play a game.", "Round 1.")
    histories = {0: ([[], []], [[], []])}
    _prompts_for(Team(), {0: [first, first]}, [0], histories, "history", 0)
    histories[0][1][0].append("A")
    histories[0][1][1].append("B")
    prompts, contexts = _prompts_for(Team(), {0: ["Round 2.", "Round 2."]}, [0], histories, "history", 1)
    expected = smol_tok.apply_chat_template(
        [*first.messages, {"role": "assistant", "content": "A"}, {"role": "user", "content": "Round 2."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompts["smol"] == [expected] and contexts["smol"] == [expected]  # the critic sees what the agent sees
    assert prompts["plain"] == [history_context([str(first), "Round 2."], ["B"])]
    # A conversation in a plain agent's history reads as its plain rendering, whatever else the history holds.
    convo = [{"role": "user", "content": "Play."}]
    histories = {0: ([[convo, first]], [["B", "C"]])}
    Team.names = ["plain"]
    prompts, _ = _prompts_for(Team(), {0: ["Round 3."]}, [0], histories, "history", 2)
    assert prompts["plain"] == ["Play.\nB\n" + str(first) + "\nC\nRound 3."]


def test_end_of_turn_is_found_from_the_template(smol_tok):
    assert chat.end_of_turn_id(smol_tok) == smol_tok.convert_tokens_to_ids(IM_END) == 2
    assert chat.stop_token_ids(smol_tok) == (2,)  # eos is already <|im_end|>
    variant = copy.deepcopy(smol_tok)
    variant.eos_token = "<|endoftext|>"
    assert chat.stop_token_ids(variant) == (0, 2)
    assert chat.end_of_turn_id(plain_tokenizer()) is None
    # Another template closing turns with another special token (as Llama 3's <|eot_id|>): found; one closing turns
    # with plain text: none, eos alone ends the answer.
    other = copy.deepcopy(smol_tok)
    turn = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}END{% endfor %}"
    other.chat_template = (turn + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}").replace(
        "END", "<file_sep>\n"
    )
    assert chat.end_of_turn_id(other) == 5 and chat.stop_token_ids(other) == (2, 5)
    other.chat_template = other.chat_template.replace("<file_sep>", "\n### ")
    assert chat.end_of_turn_id(other) is None and chat.stop_token_ids(other) == (2,)


def test_built_in_tasks_give_a_chat_form_to_templated_agents_and_the_plain_prompt_to_others(smol_tok):
    from trl_collm.tasks import get_task

    for name in (
        "writing-summary",
        "writing-tags",
        "code-humaneval",
        "building-str",
        "coord-climbing",
        "coord-repeated",
    ):
        task = get_task(name)
        env = task.make_env()
        row = task.load_dataset("train", limit=1)[0]
        observations = env.clone().reset(row)
        for obs in observations:
            assert isinstance(obs, chat.ChatPrompt), name
            assert [m["role"] for m in obs.messages] == ["system", "user"], name
            rendered = chat.agent_prompt(smol_tok, obs)
            assert rendered == smol_tok.apply_chat_template(
                list(obs.messages), tokenize=False, add_generation_prompt=True
            )
            assert chat.agent_prompt(plain_tokenizer(), obs) == str(obs)
            # The chat form holds the plain prompt's instructions and material (the writing tasks add a request).
            assert obs.messages[0]["content"] in str(obs) and obs.messages[1]["content"][:40] in str(obs), name


def test_code_task_turn_two_chat_form_is_the_conversation_so_far():
    from trl_collm.tasks.code import AGENT_NAMES, CodeEnv, load_humaneval

    row = load_humaneval("train", limit=1)[0]
    env = CodeEnv()
    env.reset(row)
    answers = ["```python\ndef aux(x):\n    return x\n```", "no code at all"]
    step = env.step(answers)
    for agent, obs, answer in zip(AGENT_NAMES, step.observations, answers):
        roles = [m["role"] for m in obs.messages]
        assert roles == ["system", "user", "assistant", "user"], agent
        assert obs.messages[2]["content"] == answer  # its own reply, verbatim
        assert obs.messages[3]["content"].startswith("Feedback on the team's previous attempt:")
        assert str(obs).startswith(obs.messages[0]["content"] + " " + obs.messages[1]["content"])


# ------------------------------------------------------------------------------------------------ generation
def _sampler(tok, model, max_new_tokens=16):
    from trl_collm.generation.backends import make_backend
    from trl_collm.generation.sampler import Sampler, SamplingSettings
    from trl_collm.team.agents import AgentTeam

    team = AgentTeam(["smol"], {"smol": tok}, policies={"smol": model})
    return Sampler(team, make_backend(), SamplingSettings(max_new_tokens=max_new_tokens, greedy=True))


def test_generation_stops_at_im_end_and_the_text_has_none(smol_tok, smol_model):
    sampler = _sampler(smol_tok, smol_model)
    gen = sampler({"smol": [chat.agent_prompt(smol_tok, m) for m in QUESTIONS]})["smol"]
    assert gen.ended.all()
    for ids, mask, text in zip(gen.response_ids, gen.response_mask, gen.texts):
        kept = ids[mask].tolist()
        assert kept[-1] == 2 and 2 not in kept[:-1]  # the action ends with its one <|im_end|>
        assert IM_END not in text and text.strip()


def test_pad_and_eos_other_than_the_end_of_turn_token(smol_tok, smol_model):
    """A tokenizer whose eos (<|endoftext|>) and pad (<file_sep>) both differ from the template's <|im_end|>, and a
    model whose generation config names only eos: the agent still stops at <|im_end|>, pads after it with pad."""
    variant = copy.deepcopy(smol_tok)
    variant.eos_token, variant.pad_token = "<|endoftext|>", "<file_sep>"
    eos, pad = variant.eos_token_id, variant.pad_token_id
    assert (eos, pad) == (0, 5)
    model_config = copy.deepcopy(smol_model.generation_config)
    smol_model.generation_config.eos_token_id, smol_model.generation_config.pad_token_id = eos, pad
    try:
        sampler = _sampler(variant, smol_model)
        assert sampler.settings_for("smol").stop_token_ids == (0, 2)
        gen = sampler({"smol": [chat.agent_prompt(variant, m) for m in QUESTIONS]})["smol"]
    finally:
        smol_model.generation_config = model_config
    assert gen.ended.all()
    lengths = gen.response_mask.sum(-1)
    assert lengths.min() < gen.response_ids.shape[1]  # one row stopped early: its tail is padding
    for ids, mask, text in zip(gen.response_ids, gen.response_mask, gen.texts):
        assert ids[mask].tolist()[-1] == 2
        assert ids[~mask].eq(pad).all()
        assert IM_END not in text and "<file_sep>" not in text


# ------------------------------------------------------------------------------------------------ training
def _conversations(n=2):
    return Dataset.from_dict({"prompt": [QUESTIONS[k % len(QUESTIONS)] for k in range(n)]})


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def test_hetero_team_templated_and_plain_trains_one_iteration(tmp_path, make_config, smollm2_path, qwen_path):
    """SmolLM2 (ChatML) beside a tiny model without a template, on a conversational dataset: each renders the
    messages its own way, and one PPO iteration trains (the conversational dataset through MultiAgentPPOTrainer).
    The tiny agent comes first so the critic is the tiny one."""
    args = make_config(
        tmp_path,
        agent_names=["tiny", "smol"],
        per_device_train_batch_size=2,
        total_episodes=2,
        num_ppo_epochs=1,
        response_length=8,
    )
    tr = MultiAgentPPOTrainer(
        args=args, model=[qwen_path, smollm2_path], train_dataset=_conversations(), reward_funcs=word_count_reward
    )
    roll = tr.rollout([{"prompt": q} for q in QUESTIONS])
    smol_tok, tiny_tok = tr.team.tokenizers["smol"], tr.team.tokenizers["tiny"]
    for k, messages in enumerate(QUESTIONS):
        smol, tiny = roll.turns[0]["smol"], roll.turns[0]["tiny"]
        assert smol.contexts[k] == smol_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert smol.gen.query_ids[k][smol.gen.query_mask[k].bool()].tolist() == template_ids(smol_tok, messages)
        assert tiny.contexts[k] == "\n".join(m["content"] for m in messages)
        assert IM_END not in smol.gen.texts[k]
    assert not chat.has_template(tiny_tok)
    out = tr.train()
    assert out.global_step == 1
    # explained variance is NaN by definition when the batch's returns are constant (algorithms.explained_variance),
    # which two 8-token episodes under a word-count reward can be; every other metric must be a number
    floats = {k: v for k, v in out.metrics.items() if isinstance(v, float) and not k.endswith("explained_variance")}
    assert floats and all(torch.isfinite(torch.tensor(v)) for v in floats.values())


def test_conversational_dataset_trains_a_lora_team_through_mc(tmp_path, smollm2_path):
    args = MultiAgentMCConfig(
        **RUN_SETTINGS,
        output_dir=str(tmp_path / "mc"),
        agent_names=["writer", "editor"],
        per_device_train_batch_size=1,
        num_generations=2,
        response_length=8,
        max_steps=1,
        seed=0,
    )
    tr = MultiAgentMCTrainer(
        args=args,
        model=smollm2_path,
        peft_config=_lora(),
        train_dataset=_conversations(1),
        reward_funcs=word_count_reward,
    )
    seen = []
    original = tr.env.step_batch

    def spy(completions, *a, **k):
        seen.extend(t for row in completions for t in row)
        return original(completions, *a, **k)

    tr.env.step_batch = spy
    assert tr.train().global_step == 1
    assert seen and all(IM_END not in t for t in seen)


# ------------------------------------------------------------------------------------------------ bad input, one line
LONE = "\ud800"  # a lone surrogate: not encodable as UTF-8, a tokenizer raises TypeError on it


class _SurrogateEnv:
    """One turn whose conversation quotes text with a lone surrogate, as generated code's error message can (a
    dataset cannot even hold one: Arrow refuses it), so it enters through the environment."""

    def __new__(cls):
        from trl_collm.envs import MultiAgentEnv, StepResult

        class Env(MultiAgentEnv):
            max_turns = 1

            def reset(self, row):
                return [[{"role": "user", "content": f"Error: {LONE} {row['prompt']}"}]]

            def step(self, completions):
                return StepResult(reward=1.0, observations=None, done=True)

        return Env()


def test_lone_surrogate_in_message_content_is_cleaned_through_train(tmp_path, make_config, qwen_path):
    """A conversation whose content holds a lone surrogate crashed train() with the tokenizer's TypeError (plain
    prompts were cleaned, message contents were not): now the content is cleaned as plain text is (U+FFFD)."""
    args = make_config(
        tmp_path, num_agents=1, per_device_train_batch_size=2, total_episodes=2, num_ppo_epochs=1, response_length=4
    )
    data = Dataset.from_dict({"prompt": ["one", "two"]})
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=data, env=_SurrogateEnv())
    roll = tr.rollout([{"prompt": "one"}, {"prompt": "two"}])
    assert roll.turns[0][tr.team.names[0]].contexts[0] == "Error: \ufffd one"
    assert tr.train().global_step == 1


def test_cleaning_a_chat_prompt_keeps_its_chat_form():
    """A ChatPrompt (plain text + chat form) with a lone surrogate came out of the cleaning as a plain str, so a
    templated agent lost that turn's conversation: it stays a ChatPrompt, both forms cleaned."""
    from trl_collm.envs.protocol import validate_observations

    dirty = chat.ChatPrompt(
        f"Fix {LONE}", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Fix {LONE}"}]
    )
    clean = chat.ChatPrompt("Fine", [{"role": "user", "content": "Fine"}])
    out = validate_observations([dirty, clean], "env.reset", 0, 2, ["a", "b"])
    assert isinstance(out[0], chat.ChatPrompt) and str(out[0]) == "Fix \ufffd"
    assert out[0].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix \ufffd"})
    assert out[1] is clean  # nothing to clean: the same object


def test_a_role_the_chat_template_refuses_is_one_line():
    """A template's raise_exception (here: only user / assistant roles) surfaced as jinja's TemplateError."""
    tok = plain_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    assert chat.agent_prompt(tok, [{"role": "user", "content": "hi"}]) == "user: hi\nassistant: "
    with pytest.raises(ValueError) as info:
        chat.agent_prompt(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    message = str(info.value)
    assert "\n" not in message and "refuses a conversation with the roles ['system', 'user']" in message
    assert "Only user and assistant roles are supported!" in message and "plain-text prompts" in message


def test_the_chat_page_snippet_runs_as_written(tmp_path, monkeypatch, smollm2_name):
    """docs/chat.md's first snippet, executed unchanged (in a scratch folder: it writes outputs/chat)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "chat.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet, "docs/chat.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1 and trainer.team.names == ["alice", "bob"]
    assert 0.0 <= trainer.metrics_history[-1]["objective/scores"] <= 1.0
