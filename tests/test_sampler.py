"""The sampling seam (trl_collm/generation/sampler.py): the `SamplingSettings` record (from a config, to generate()
kwargs, to and from team.json), the backend contract and registry, `weights_changed()` after every update, and a
saved team sampled by eval exactly as training sampled it."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOTrainer
from trl_collm.generation.backends import GenerateBackend, make_backend
from trl_collm.generation.sampler import (
    BACKENDS,
    GenerationBackend,
    Sampler,
    SamplingSettings,
    register_backend,
)


def _args(**overrides):
    fields = dict(response_length=6, temperature=0.8, top_p=0.9, top_k=5, stop_token_id=7)
    return types.SimpleNamespace(**{**fields, **overrides})


def test_settings_from_a_config_and_as_generate_kwargs():
    s = SamplingSettings.from_config(_args())
    assert s == SamplingSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, top_k=5, stop_token_ids=(7,))
    assert s.generate_kwargs(pad_id=3) == {
        "max_new_tokens": 6,
        "do_sample": True,
        "pad_token_id": 3,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 5,
        "eos_token_id": 7,
    }
    # greedy: the sampling filters are left out (generate() warns about them), the stop token stays
    greedy = SamplingSettings.from_config(_args(), greedy=True).generate_kwargs(pad_id=3)
    assert greedy == {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 3, "eos_token_id": 7}
    # top_k None and TRL's 0 both mean "off": one spelling in the record, generate()'s 0 in the kwargs (left out,
    # generate() would apply its default top-k of 50)
    off = SamplingSettings.from_config(_args(top_k=0, stop_token_id=None))
    assert off.top_k is None and off == SamplingSettings.from_config(_args(top_k=None, stop_token_id=None))
    kwargs = off.generate_kwargs(pad_id=0)
    assert kwargs["top_k"] == 0 and "eos_token_id" not in kwargs
    assert SamplingSettings(4, stop_token_ids=[7, 9]).generate_kwargs(0)["eos_token_id"] == [7, 9]


def test_settings_round_trip_through_team_json():
    s = SamplingSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, top_k=5, stop_token_ids=(7,))
    entry = s.to_team_json()
    # the key names team.json has always had (older saved teams load the same way)
    assert entry == {"response_length": 6, "temperature": 0.8, "top_p": 0.9, "top_k": 5, "stop_token_id": 7}
    assert SamplingSettings.from_team_json(entry) == s
    assert SamplingSettings.from_team_json(entry, greedy=True) == dataclasses.replace(s, greedy=True)
    # overrides replace recorded fields; None keeps them (an unset command-line flag)
    assert SamplingSettings.from_team_json(entry, max_new_tokens=None, temperature=0.5).temperature == 0.5
    two = SamplingSettings(4, stop_token_ids=(7, 9))
    assert two.to_team_json()["stop_token_id"] == [7, 9] and SamplingSettings.from_team_json(two.to_team_json()) == two
    assert SamplingSettings.from_team_json({}) == SamplingSettings(max_new_tokens=64)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=4, temperature=0.0), "temperature"),
        (dict(max_new_tokens=4, top_p=1.5), "top_p"),
        (dict(max_new_tokens=4, top_k=-1), "top_k"),
        (dict(max_new_tokens=4, min_p=1.5), "min_p"),
        (dict(max_new_tokens=4, repetition_penalty=0.0), "repetition_penalty"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^SamplingSettings\.{field} must be") as err:
        SamplingSettings(**kwargs)
    assert "\n" not in str(err.value)
    SamplingSettings(max_new_tokens=4, temperature=0.0, greedy=True)  # no temperature is used when greedy


def test_grpo_settings_as_generate_kwargs_and_in_team_json():
    """GRPO's min_p, repetition_penalty and generation_kwargs: passed to generate() (the penalty under greedy
    decoding too: it is a logits processor, not a sampling filter), written to team.json only when set (an older
    team's entry is unchanged) and read back; whether the recorded log-probs are the policy's."""
    s = SamplingSettings(4, min_p=0.1, repetition_penalty=1.2, generation_kwargs='{"typical_p": 0.9}')
    kwargs = s.generate_kwargs(pad_id=0)
    assert (kwargs["min_p"], kwargs["repetition_penalty"], kwargs["typical_p"]) == (0.1, 1.2, 0.9)
    greedy = dataclasses.replace(s, greedy=True).generate_kwargs(pad_id=0)
    assert "min_p" not in greedy and greedy["repetition_penalty"] == 1.2
    assert "min_p" not in SamplingSettings(4).generate_kwargs(0)  # 0: off (generate() would add a no-op warper)
    entry = s.to_team_json()
    assert (entry["min_p"], entry["repetition_penalty"], entry["generation_kwargs"]) == (0.1, 1.2, {"typical_p": 0.9})
    assert SamplingSettings.from_team_json(entry) == s and hash(SamplingSettings.from_team_json(entry)) == hash(s)
    assert set(SamplingSettings(4).to_team_json()) == {
        "response_length",
        "temperature",
        "top_p",
        "top_k",
        "stop_token_id",
    }
    # the recorder sits after penalties and before the filters: a penalty (or an unknown kwarg) changes what it sees
    assert s.changes_logits() and not SamplingSettings(4, min_p=0.1).changes_logits()
    assert not SamplingSettings(4, generation_kwargs={"typical_p": 0.9, "suppress_tokens": None}).changes_logits()
    assert SamplingSettings(4, generation_kwargs={"no_repeat_ngram_size": 2}).changes_logits()
    assert SamplingSettings(4, generation_kwargs={"something_new": 1}).changes_logits()
    # the engine's log-probs compare with the trainer's only without filters or penalties
    assert SamplingSettings(4).samples_the_policy() and not SamplingSettings(4, min_p=0.1).samples_the_policy()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": 0.5}, r"sets 'temperature', a setting of its own here: set temperature instead"),
        ({"num_beams": 4}, r"sets 'num_beams', .*: set sampling: one completion per row"),
        ({"eos_token_id": 2}, r"sets 'eos_token_id', .*: set stop_token_id instead"),
        ('{"typical_p": ', r"is not a JSON object"),
        ([1, 2], r"must be a dict of keyword arguments"),
        ({"typical_p": {1, 2}}, r"must hold JSON values"),
    ],
)
def test_bad_generation_kwargs_are_refused_naming_what_to_use(kwargs, message):
    with pytest.raises(ValueError, match=r"^`generation_kwargs`.*" + message) as err:
        SamplingSettings(4, generation_kwargs=kwargs)
    assert "\n" not in str(err.value)


def test_backends_register_by_name_and_are_built_from_the_arguments(monkeypatch):
    with pytest.raises(TypeError):
        GenerationBackend()  # the contract: a backend must implement generate()
    with pytest.raises(ValueError, match="has no `name`"):
        register_backend(type("Nameless", (GenerateBackend,), {"name": ""}))
    assert isinstance(make_backend(None), GenerateBackend)
    built = make_backend(types.SimpleNamespace(local_rollout_forward_batch_size=3, share_prompt_prefix=False))
    assert (built.batch_size, built.share_prefix) == (3, False)
    from trl_collm.generation import backends

    monkeypatch.setattr(backends, "backend_name", lambda args: "nope")
    with pytest.raises(ValueError, match=r"generation backend 'nope' is not available \(registered: "):
        make_backend(None)
    monkeypatch.undo()
    vllm_backend = BACKENDS["vllm"]

    @register_backend
    class FakeEngine(GenerateBackend):
        name = "vllm"

    try:
        assert type(make_backend(types.SimpleNamespace(use_vllm=True))) is FakeEngine
    finally:
        BACKENDS["vllm"] = vllm_backend


class RecordingBackend(GenerateBackend):
    """HF generate(), logging when it generates and when it is told the weights changed (with the trainer's step
    and a fingerprint of the agents' weights at that moment)."""

    def __init__(self, trainer, **kwargs):
        super().__init__(**kwargs)
        self.trainer, self.events = trainer, []

    def _fingerprint(self):
        team = self.trainer.team
        return sum(float(p.detach().double().sum()) for a in team.names for p in team.agent_parameters(a))

    def weights_changed(self):
        self.events.append(("weights", self.trainer.state.global_step, self._fingerprint()))

    def generate(self, *args, **kwargs):
        self.events.append(("generate", self.trainer.state.global_step, None))
        return super().generate(*args, **kwargs)


def _reward(prompts, completions, **kw):
    # completions: one list of the agents' texts per episode; the reward differs between episodes, so updates move
    return [float(sum(ord(ch) for text in texts for ch in text) % 7) for texts in completions]


@pytest.mark.parametrize("kind", ["ppo", "mc"])
def test_weights_changed_is_called_after_every_update(tmp_path, make_config, prompts_dataset, qwen_path, kind):
    """The backend hears of new weights once per iteration, after its optimizer steps and before the next generation
    (the check on `global_step` sits before every rollout, whichever path, plain or DeepSpeed, stepped); with no
    update in between it is not told again."""
    if kind == "ppo":
        args = make_config(tmp_path, num_agents=2, total_episodes=12)  # 3 iterations of 4 episodes
        trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    else:
        from conftest import RUN_SETTINGS

        args = MultiAgentMCConfig(
            output_dir=str(tmp_path / "out"),
            num_agents=2,
            num_generations=2,
            per_device_train_batch_size=2,
            total_episodes=6,  # 3 iterations of 2 prompts
            response_length=4,
            learning_rate=1e-2,
            seed=0,
            **RUN_SETTINGS,
        )
        trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    spy = RecordingBackend(trainer, batch_size=args.local_rollout_forward_batch_size)
    trainer.sampler = dataclasses.replace(trainer.sampler, backend=spy)
    trainer.train()
    told = [e for e in spy.events if e[0] == "weights"]
    assert [step for _, step, _ in told] == [0, 1, 2]
    # every time after the first, the weights really are new (the optimizer steps ran before the call)
    prints = [fp for _, _, fp in told]
    assert all(a != b for a, b in zip(prints, prints[1:]))
    # each generation comes after the call for its step
    last = None
    for event, step, _ in spy.events:
        if event == "weights":
            last = step
        else:
            assert last == step
    # a rollout after training sees the last update's weights; a second one, with no update in between, is not told
    for _ in range(2):
        trainer.rollout([prompts_dataset[0]]) if kind == "ppo" else trainer.sample([prompts_dataset[0]])
    assert [step for event, step, _ in spy.events if event == "weights"] == [0, 1, 2, 3]


def test_eval_samples_a_saved_team_as_training_did(tmp_path, make_config, prompts_dataset, qwen_path):
    """Train, save, load: the settings eval reads back are the training sampler's (top-p, top-k, stop token
    included), and with one seed the loaded team's sampler draws exactly the training sampler's tokens."""
    from trl_collm.inference import load_team, play, saved_settings

    args = make_config(tmp_path, num_agents=2, total_episodes=4, temperature=0.8, top_p=0.9, top_k=5, stop_token_id=9)
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    trainer.train()
    trainer.save_model()
    out = args.output_dir
    settings = saved_settings(out, greedy=False)
    assert settings == trainer.sampler.settings
    assert (settings.temperature, settings.top_p, settings.top_k, settings.stop_token_ids) == (0.8, 0.9, 5, (9,))
    assert saved_settings(out) == dataclasses.replace(settings, greedy=True)  # eval decodes greedily by default

    team = load_team(out)
    prompts = [prompts_dataset[i]["prompt"] for i in range(6)]
    observations = {a: list(prompts) for a in team.names}
    trainer.model.eval()
    torch.manual_seed(123)
    trained = trainer.sampler_for_step()(observations)
    torch.manual_seed(123)
    loaded = Sampler(team, make_backend(), settings)(observations)
    for a in team.names:
        assert torch.equal(loaded[a].response_ids, trained[a].response_ids), a
        assert loaded[a].texts == trained[a].texts
    # the seed decides the draw (the comparison above has power)
    torch.manual_seed(124)
    other = Sampler(team, make_backend(), settings)(observations)
    assert any(not torch.equal(other[a].response_ids, trained[a].response_ids) for a in team.names)

    # play() runs the same sampler: its completions are the training sampler's too
    env = trainer.env
    torch.manual_seed(5)
    transcripts = play(team, env, [{"prompt": p} for p in prompts], settings=settings)
    torch.manual_seed(5)
    roll = trainer.rollout([{"prompt": p} for p in prompts])
    for e, tr in enumerate(transcripts):
        for a in team.names:
            assert tr["turns"][0]["agents"][a]["completion"] == roll.turns[0][a].gen.texts[e]


def test_a_saved_mc_team_is_sampled_with_grpos_settings(tmp_path, prompts_dataset, qwen_path):
    """MC with GRPO's min_p, repetition_penalty and generation_kwargs: the training sampler has them, team.json records
    them, and eval / play (saved_settings) read them back."""
    from trl_collm.inference import saved_settings
    from trl_collm.testing import CPU_RUN_SETTINGS

    args = MultiAgentMCConfig(
        **dict(CPU_RUN_SETTINGS, output_dir=str(tmp_path / "mc")),
        num_agents=1,
        num_generations=2,
        per_device_train_batch_size=2,
        total_episodes=2,
        response_length=4,
        min_p=0.05,
        repetition_penalty=1.1,
        generation_kwargs={"typical_p": 0.95},
    )
    trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    trainer.train()
    trainer.save_model()
    trained = trainer.sampler.settings
    assert (trained.min_p, trained.repetition_penalty, trained.generation_kwargs) == (0.05, 1.1, {"typical_p": 0.95})
    assert saved_settings(args.output_dir, greedy=False) == trained


def test_stop_token_masks_and_a_tokenizer_without_eos():
    """The first stop token ends (and belongs to) the action; several stop ids all stop; a tokenizer without an eos
    token and no `stop_token_id` is refused with one line naming the agent."""
    tok = types.SimpleNamespace(eos_token_id=None, decode=lambda ids, **kw: " ".join(map(str, ids)))
    team = types.SimpleNamespace(tokenizers={"a": tok}, pad_id=lambda name: 0)
    q = torch.ones(2, 1, dtype=torch.long)
    response = torch.tensor([[4, 7, 5, 9], [4, 5, 9, 7]])
    sampler = Sampler(team, GenerateBackend(), SamplingSettings(4, stop_token_ids=(7, 9)))
    gen = sampler._finish("a", q, q, response)
    assert gen.response_mask.tolist() == [[True, True, False, False], [True, True, True, False]]
    assert gen.response_ids.tolist() == [[4, 7, 0, 0], [4, 5, 9, 0]] and gen.texts == ["4", "4 5"]
    assert gen.ended.tolist() == [True, True]
    with pytest.raises(ValueError, match=r"^agent 'a''s tokenizer has no eos_token; set `stop_token_id`"):
        sampler.with_settings(SamplingSettings(4))._finish("a", q, q, response)


def test_backend_options_are_read_once_and_typed():
    """`BackendOptions.from_args` is the one reading of a config's / namespace's backend fields: absent fields take
    their defaults, the command line's JSON becomes a dict, and no backend reads `args` itself."""
    import pathlib

    from trl_collm.generation import backends
    from trl_collm.generation.sampler import BackendOptions

    ns = types.SimpleNamespace(
        use_transformers_continuous_batching=True, transformers_continuous_batching_config='{"page_size": 16}'
    )
    options = BackendOptions.from_args(ns)
    assert options.transformers_continuous_batching_config == {"page_size": 16}
    # absent: the defaults (64 rows per generate() call since 966d120)
    assert (options.local_rollout_forward_batch_size, options.share_prompt_prefix, options.use_vllm) == (
        64,
        True,
        False,
    )
    assert BackendOptions.from_args(None) == BackendOptions() and BackendOptions.from_args(options) is options
    built = make_backend(ns)
    assert isinstance(built, backends.ContinuousBatchingBackend) and built.config == {"page_size": 16}
    folder = pathlib.Path(backends.__file__).parent
    loose = [p.name for p in folder.glob("*.py") if "getattr(args" in p.read_text() and p.name != "sampler.py"]
    assert loose == []  # sampler.py: SamplingSettings.from_config and BackendOptions.from_args, one each


def test_backend_options_and_the_configs_share_one_default_per_field():
    """`BackendOptions` (what eval / play fall back on) and the trainer configs hold the same default for every
    backend field: the configs read theirs from `BackendOptions`."""
    import dataclasses

    from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
    from trl_collm.generation.sampler import BackendOptions

    options = {f.name: f.default for f in dataclasses.fields(BackendOptions)}
    # the two that differed (None in BackendOptions): TRL's 64 rows per call and GRPO's importance-sampling cap 3.0
    assert (options["local_rollout_forward_batch_size"], options["vllm_importance_sampling_clip_max"]) == (64, 3.0)
    for config in (MultiAgentPPOConfig, MultiAgentMCConfig):
        defaults = {f.name: f.default for f in dataclasses.fields(config) if f.name in options}
        assert defaults.keys() == options.keys(), config.__name__
        assert {k: v for k, v in defaults.items() if v != options[k]} == {}, config.__name__
