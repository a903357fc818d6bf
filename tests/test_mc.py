"""MultiAgentMCTrainer: tree returns, cross-mode credit, early termination and the MAGRPO preset, against numbers
worked out by hand; end-to-end runs with tiny offline models."""

import types

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from rounding import assert_trained_weights_close, trained_weights
from transformers import AutoModelForCausalLM

from trl_collm import MultiAgentEnv, MultiAgentMCConfig, MultiAgentMCTrainer, RewardFunctionEnv, StepResult
from trl_collm.generation.prompts import PromptSettings
from trl_collm.generation.sampler import Generation
from trl_collm.rollout import AgentTurn, SampleTree, run_cross, run_tree
from trl_collm.testing import build_tokenizer

from toy import ConstantPolicy, generation, reinforce_step


class ScriptedTeam:
    """Stands in for the Sampler (and its team) in the runners: each call pops the next scripted texts per agent."""

    def __init__(self, names, script):
        self.names = names
        self.script = list(script)  # one dict agent -> list of texts per generate() call
        self.prompts_seen = []
        self.team = self
        self.tokenizers = dict.fromkeys(names)  # no chat templates: the runners pass the prompts as they are
        self.prompts = PromptSettings()  # the runners read agent_context from the sampler

    def decode_observation(self, name, obs):
        return obs

    def __call__(self, prompts):
        texts = self.script.pop(0)
        self.prompts_seen.append(prompts)
        out = {}
        for a in self.names:
            assert len(texts[a]) == len(prompts[a]), (a, texts[a], prompts[a])
            z = torch.zeros(len(texts[a]), 1, dtype=torch.long)
            out[a] = Generation(
                z,
                torch.ones_like(z),
                z,
                torch.ones_like(z, dtype=torch.bool),
                list(texts[a]),
                torch.ones(len(z), dtype=torch.bool),
            )
        return out


class SumEnv(MultiAgentEnv):
    """Joint reward = the sum of the numbers the agents write; observations carry the turn; done after 2 turns."""

    def reset(self, row):
        self.t = 0
        return [f"{row['prompt']} t0", f"{row['prompt']} t0"]

    def step(self, completions):
        self.t += 1
        return StepResult(reward=sum(float(c) for c in completions), observations=[f"t{self.t}"] * 2, done=self.t >= 2)


def _tree(script, **kw):
    team = ScriptedTeam(["a", "b"], script)
    return run_tree(team, SumEnv(), [{"prompt": "p"}], 2, 2, kw.pop("expansion", "tree"), **kw), team


def test_tree_returns_and_group_advantages_by_hand(tmp_path):
    script = [
        {"a": ["1", "0"], "b": ["0", "0"]},  # turn 0: node rewards [1, 0]
        {
            "a": ["2", "0", "1", "1"],
            "b": ["0", "0", "0", "1"],
        },  # turn 1: children of node 0 -> [2, 0], of node 1 -> [1, 2]
    ]
    tree, team = _tree(script)
    assert [len(r) for r in tree.rewards] == [2, 4]
    assert tree.parents[1].tolist() == [0, 0, 1, 1]
    assert tree.groups[1][0] == tree.groups[1][1] != tree.groups[1][2] == tree.groups[1][3]
    assert team.prompts_seen[1]["a"] == ["t1"] * 4  # children continue from their parent's post-step state
    R = tree.returns(gamma=0.5)
    # R1 = rewards; R0[0] = 1 + 0.5 * mean(2, 0) = 1.5; R0[1] = 0 + 0.5 * mean(1, 2) = 0.75
    # (joint: same for both agents)
    assert torch.allclose(R[1][:, 0], torch.tensor([2.0, 0.0, 1.0, 2.0]))
    assert torch.allclose(R[0], torch.tensor([[1.5, 1.5], [0.75, 0.75]]))
    cfg = MultiAgentMCConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gamma=0.5, report_to=[])
    trainer = types.SimpleNamespace(args=cfg)
    adv = MultiAgentMCTrainer.advantages(trainer, tree).advantages
    # turn 0 group (the prompt): mean 1.125 -> [0.375, -0.375];
    # turn 1: siblings [2, 0] -> [1, -1], [1, 2] -> [-0.5, 0.5]
    assert torch.allclose(adv[0][:, 0], torch.tensor([0.375, -0.375]))
    assert torch.allclose(adv[1][:, 1], torch.tensor([1.0, -1.0, -0.5, 0.5]))


def test_tree_early_termination_stops_a_branch():
    script = [
        {"a": ["1", "0"], "b": ["0", "0"]},  # node 0 mean reward 1 > 0.9: terminal; node 1 (0) continues
        {"a": ["1", "1"], "b": ["0", "1"]},  # only node 1's two children: rewards [1, 2]
    ]
    tree, _ = _tree(script, early_termination_threshold=0.9)
    assert [len(r) for r in tree.rewards] == [2, 2]
    assert tree.parents[1].tolist() == [1, 1]
    R = tree.returns(gamma=0.5)
    # R0 = [1 (leaf), 0 + 0.5 * mean(1, 2) = 0.75]
    assert torch.allclose(R[0][:, 0], torch.tensor([1.0, 0.75]))


def test_per_branch_expansion_costs_g_times_t():
    script = [{"a": ["1", "0"], "b": ["0", "0"]}, {"a": ["2", "1"], "b": ["0", "1"]}]
    tree, _ = _tree(script, expansion="per_branch")
    assert [len(r) for r in tree.rewards] == [2, 2]
    assert tree.parents[1].tolist() == [0, 1]
    R = tree.returns(gamma=1.0)
    assert torch.allclose(R[0][:, 0], torch.tensor([1.0 + 2.0, 0.0 + 2.0]))
    assert tree.groups[1].tolist() == [0, 0]  # the prompt's branches are compared with each other at every turn


def test_cross_mode_credits_each_sample_with_its_combinations():
    team = ScriptedTeam(["a", "b"], [{"a": ["1", "3"], "b": ["0", "2"]}])
    env = RewardFunctionEnv(lambda prompts, completions, **k: [float(x) + float(y) for x, y in completions])
    tree = run_cross(team, env, [{"prompt": "p"}], 2, 16, torch.Generator().manual_seed(0))
    # combos (a, b): (1,0)=1, (1,2)=3, (3,0)=3, (3,2)=5
    # -> a0: mean(1,3)=2, a1: mean(3,5)=4; b0: mean(1,3)=2, b1: mean(3,5)=4
    assert torch.allclose(tree.rewards[0], torch.tensor([[2.0, 2.0], [4.0, 4.0]]))
    assert tree.credit_mask[0].all()
    # capped at 2 of the 4 combinations (drawn without replacement from the seeded generator): a sample's credit is
    # the mean over the drawn combinations it is in; a sample in none is masked out.
    team = ScriptedTeam(["a", "b"], [{"a": ["1", "3"], "b": ["0", "2"]}])
    tree = run_cross(team, env, [{"prompt": "p"}], 2, 2, torch.Generator().manual_seed(0))
    drawn = [(f // 2, f % 2) for f in torch.randperm(4, generator=torch.Generator().manual_seed(0))[:2].tolist()]
    table = {(0, 0): 1.0, (0, 1): 3.0, (1, 0): 3.0, (1, 1): 5.0}
    for agent in range(2):
        for g in range(2):
            mine = [table[c] for c in drawn if c[agent] == g]
            assert bool(tree.credit_mask[0][g, agent]) == bool(mine)
            assert float(tree.rewards[0][g, agent]) == (sum(mine) / len(mine) if mine else 0.0)


# ------------------------------------------------------------------ MAGRPO preset: gradient by hand


def test_magrpo_preset_matches_analytic_reinforce_gradient(tmp_path):
    """loss_i = mean_g -(sum_j log softmax(theta_i)[y_gj]) * (R_g - mean R); every completion token counts
    (the reference drops the last one; we don't). One SGD step per agent (MAGRPO's per (agent, turn) schedule)."""
    eta = 0.1
    thetas = [[0.1, -0.2, 0.3, 0.0, 0.5, -0.1, 0.2], [0.0, 0.4, -0.3, 0.2, 0.1, 0.0, -0.5]]
    policies = [ConstantPolicy(t) for t in thetas]
    params = [p for m in policies for p in m.parameters()]
    args = MultiAgentMCConfig(
        output_dir=str(tmp_path),
        preset="magrpo",
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        agent_names=["alice", "bob"],
        per_device_train_batch_size=1,
    )
    trainer = MultiAgentMCTrainer(
        args=args,
        processing_class=build_tokenizer(),
        model=policies,
        train_dataset=Dataset.from_dict({"prompt": ["p"]}),
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        optimizers=(torch.optim.SGD(params, lr=eta), None),
    )
    trainer._batch_sizes()
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])  # joint, G = 4 samples of one prompt
    responses = {"alice": [[2, 3], [4], [2, 2, 6], [5, 3]], "bob": [[1], [3, 4], [6, 6], [2]]}
    ids = torch.arange(4)
    turn = {a: AgentTurn(a, 0, ids, ["p"] * 4, ["p"] * 4, generation(responses[a])) for a in responses}
    tree = SampleTree(
        ["alice", "bob"],
        [{}],
        [turn],
        [rewards.view(4, 1).expand(4, 2).clone()],
        [torch.full((4,), -1)],
        [torch.zeros(4, dtype=torch.long)],
        [torch.zeros(4, dtype=torch.long)],
    )
    adv = rewards - rewards.mean()  # no std scaling in MAGRPO
    expected = [reinforce_step(theta, responses[a], adv, eta) for a, theta in zip(["alice", "bob"], thetas)]
    trainer.model.train()
    trainer.learn(tree)
    for policy, exp in zip(policies, expected):
        assert torch.allclose(policy.theta.detach(), exp, atol=1e-6)
    assert not torch.allclose(policies[0].theta.detach(), torch.tensor(thetas[0]))


# ------------------------------------------------------------------ end to end with tiny models
def _reward(prompts, completions, **kw):
    return [float(sum(len(c) for c in cs) % 5) for cs in completions]


@pytest.mark.parametrize("num_agents, shared", [(2, False), (3, False), (2, True), (3, True)])
def test_mc_end_to_end_every_agent_changes_and_reloads(tmp_path, qwen_path, prompts_dataset, num_agents, shared):
    names = [f"ag{i}" for i in range(num_agents)]
    args = MultiAgentMCConfig(
        output_dir=str(tmp_path / "out"),
        agent_names=names,
        num_generations=3,
        per_device_train_batch_size=2,
        total_episodes=4,
        response_length=6,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
        baseline="loo",
        scale_advantages=True,
    )
    kw = dict(peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"])) if shared else {}
    trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward, **kw)
    assert trainer.critic is None
    before = {a: [p.detach().clone() for p in trainer.team.agent_parameters(a)] for a in names}
    trainer.train()
    for a in names:
        after = trainer.team.agent_parameters(a)
        assert any(not torch.equal(b, p) for b, p in zip(before[a], after)), a
    trainer.save_model()
    for a in names:
        folder = tmp_path / "out" / a
        if shared:
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen_path), str(folder))
            saved = {n: p for n, p in model.named_parameters() if "lora_A" in n}
            assert saved, "adapter weights reloaded"
            live = [p for n, p in trainer.team.shared_base.named_parameters() if "lora_A" in n and f".{a}." in n]
            assert torch.allclose(next(iter(saved.values())), live[0].cpu())
        else:
            model = AutoModelForCausalLM.from_pretrained(str(folder))
            ref = trainer.team.policies[a]
            assert torch.equal(model.lm_head.weight, ref.lm_head.weight.cpu())
    assert (tmp_path / "out" / "team.json").exists()
    assert not (tmp_path / "out" / "critic").exists()


def test_mc_multiturn_tree_and_clipped_loss_with_kl(tmp_path, qwen_path, prompts_dataset):
    class Env(MultiAgentEnv):
        def reset(self, row):
            self.t = 0
            return [row["prompt"], row["prompt"]]

        def step(self, completions):
            self.t += 1
            return StepResult(reward=float(len(completions[0]) % 2), observations=["again", "again"], done=self.t >= 2)

    args = MultiAgentMCConfig(
        output_dir=str(tmp_path / "o"),
        num_agents=2,
        num_turns=2,
        num_generations=2,
        loss_type="clipped",
        num_iterations=2,
        beta=0.1,
        per_device_train_batch_size=2,
        total_episodes=2,
        response_length=5,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
    )
    trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=Env())
    out = trainer.train()
    assert out.metrics["mc/nodes"] == 2 * (2 + 4)  # 2 prompts x (G + G^2) nodes
    assert "objective/kl" in out.metrics and out.metrics["objective/kl"] >= 0


def test_mc_config_errors(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="baseline"):
        MultiAgentMCConfig(**base, baseline="median")
    with pytest.raises(ValueError, match="joint_mode"):
        MultiAgentMCConfig(**base, joint_mode="cross", num_turns=2)
    with pytest.raises(ValueError, match="num_iterations"):
        MultiAgentMCConfig(**base, loss_type="reinforce", num_iterations=2)
    with pytest.raises(ValueError, match="num_generations"):
        MultiAgentMCConfig(**base, num_generations=1)
    with pytest.raises(ValueError, match="preset"):
        MultiAgentMCConfig(**base, preset="grpo")


def test_mc_micro_batch_holds_every_sample_of_its_prompts(tmp_path, qwen_path, prompts_dataset):
    """per_device_train_batch_size counts prompts: one forward/backward part per agent holds their 2 x G samples."""
    args = MultiAgentMCConfig(
        output_dir=str(tmp_path / "out"),
        num_agents=2,
        num_generations=3,
        per_device_train_batch_size=2,
        total_episodes=4,
        response_length=4,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
    )
    trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    assert trainer.micro_batch_rows() == 6
    rows = []
    original = trainer.team.logprobs
    trainer.team.logprobs = lambda name, q, *a, **k: rows.append(len(q)) or original(name, q, *a, **k)
    trainer.train()
    # 2 iterations x 2 agents, one part each with all 2 prompts x 3 samples (REINFORCE: no scoring forwards).
    assert rows == [6] * 4


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_a_longer_budget_repeats_a_shorter_runs_start_only_at_a_constant_rate(
    tmp_path, qwen_path, prompts_dataset, schedule
):
    """Why a seeded run with a larger budget matches a shorter one for a few iterations, then parts (issue 28's MC
    seed 0 at 128 env steps against the table's 64): the default schedule decays the rate linearly to zero over the
    run's own length, so from the second update on the two runs step at different rates. With a constant rate the
    longer run's first iterations are the shorter run, bitwise."""
    from transformers import TrainerCallback

    from trl_collm.testing import CPU_RUN_SETTINGS

    def weights_after_iterations_1_and_2(iterations: int) -> dict[int, list[torch.Tensor]]:
        args = MultiAgentMCConfig(
            output_dir=str(tmp_path / f"out{iterations}"),
            agent_names=["a", "b"],
            num_generations=2,
            per_device_train_batch_size=2,
            total_episodes=2 * iterations,
            response_length=4,
            learning_rate=1e-2,
            lr_scheduler_type=schedule,
            seed=0,
            **CPU_RUN_SETTINGS,
        )
        trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
        seen = {}

        class Snapshot(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step in (1, 2):
                    team = trainer.team
                    seen[state.global_step] = [p.detach().clone() for a in team.names for p in team.agent_parameters(a)]

        trainer.add_callback(Snapshot())
        trainer.train()
        assert trainer.state.global_step == iterations  # one optimizer step per iteration here
        return seen

    short, longer = weights_after_iterations_1_and_2(2), weights_after_iterations_1_and_2(4)

    def same(step):
        return all(torch.equal(x, y) for x, y in zip(short[step], longer[step], strict=True))

    assert same(1)  # the first update runs at the initial rate in both
    assert same(2) == (schedule == "constant")


@pytest.mark.parametrize("loss_type", ["grpo", "reinforce"])
def test_old_logprobs_from_the_update_match_the_scoring_pass(tmp_path, qwen_path, prompts_dataset, loss_type):
    """Skipping scoring's old log-prob forward (`old_logprobs_from_update`, trainers/plan.py) must not change a single
    update: same weights and logged losses, up to float rounding, as a run with the switch off, which scores them;
    and each run really took its path (the short one only the update's forwards, with gradients)."""
    from trl_collm.testing import CPU_RUN_SETTINGS

    runs = []
    for switch in (True, False):
        args = MultiAgentMCConfig(
            output_dir=str(tmp_path / str(switch)),
            agent_names=["a", "b"],
            num_generations=2,
            per_device_train_batch_size=2,
            total_episodes=4,
            response_length=4,
            learning_rate=1e-2,
            loss_type=loss_type,
            old_logprobs_from_update=switch,
            seed=0,
            **CPU_RUN_SETTINGS,
        )
        trainer = MultiAgentMCTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
        assert trainer.plan_iteration(4).old_logprobs_from_update.on is switch
        before = trained_weights(trainer)
        calls = []
        original = trainer.team.logprobs
        trainer.team.logprobs = lambda *a, **k: calls.append(torch.is_grad_enabled()) or original(*a, **k)
        trainer.train()
        after = trained_weights(trainer)
        assert all(not torch.equal(before[a], after[a]) for a in after), "every agent trained"
        logged = [h for h in trainer.state.log_history if "loss/policy_avg" in h]
        runs.append((after, logged, calls))
    (weights_on, logs_on, calls_on), (weights_off, logs_off, calls_off) = runs
    # 2 iterations x 2 agents: the short path makes only the update's forwards; the switched-off one scores as well.
    assert calls_on == [True] * 4 and calls_off.count(True) == 4 and calls_off.count(False) == 4
    for a in weights_on:  # GRPO's ratio: scoring's forward and the update's (on the kept prefill) differ by rounding
        assert_trained_weights_close(weights_on[a], weights_off[a], lr=1e-2)
        assert torch.equal(weights_on[a], weights_off[a]) or loss_type != "reinforce"  # REINFORCE reads none
    assert len(logs_on) == len(logs_off) == 2
    for hon, hoff in zip(logs_on, logs_off):
        for key in ("loss/policy_avg", "objective/scores", "policy/entropy_avg"):
            assert hon[key] == pytest.approx(hoff[key], rel=1e-4, abs=1e-6), key
