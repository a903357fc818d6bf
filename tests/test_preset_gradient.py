"""The `collm` preset reproduces the reference update rule: checked against gradients worked out by hand.

The toy team has *constant* models: each policy's logits are a learnable vector theta (the same at every position),
and the critic's value is w * 1 + b whatever it reads. With SGD (lr = eta) every parameter change of one update can
then be written in closed form:
- policy i: loss = mean_s -(sum_j log softmax(theta_i)[y_sj]) * A_s, so
  grad = mean_s -A_s * sum_j (onehot(y_sj) - softmax(theta_i));
- advantages: delta = r - V (one turn), z-scored per (agent, turn) with the population std (clamped at 1e-6);
- critic: 0.6 * mean (V - r)^2, stepped once per agent (the reference's schedule), so w and b move twice.
"""

import types

import torch
from datasets import Dataset
from torch import nn
from transformers import PretrainedConfig

from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
from trl_collm.rollout import AgentTurn, Rollout
from trl_collm.testing import build_tokenizer

from toy import ConstantPolicy, generation, reinforce_step


class _OnesBody(nn.Module):
    def forward(self, input_ids, **kwargs):
        return types.SimpleNamespace(last_hidden_state=torch.ones(*input_ids.shape, 1))


class ConstantCritic(nn.Module):
    base_model_prefix = "model"

    def __init__(self, w, b):
        super().__init__()
        self.model = _OnesBody()
        self.score = nn.Linear(1, 1)
        with torch.no_grad():
            self.score.weight.fill_(w)
            self.score.bias.fill_(b)
        self.config = PretrainedConfig(hidden_size=1, pad_token_id=0, num_labels=1)


def test_collm_preset_matches_analytic_gradient(tmp_path):
    eta = 0.1
    thetas = [[0.1, -0.2, 0.3, 0.0, 0.5, -0.1, 0.2], [0.0, 0.4, -0.3, 0.2, 0.1, 0.0, -0.5]]
    w0, b0 = 0.2, 0.3
    policies = [ConstantPolicy(t) for t in thetas]
    critic_model = ConstantCritic(w0, b0)
    params = [p for m in policies for p in m.parameters()] + list(critic_model.parameters())
    tok = build_tokenizer()
    args = MultiAgentPPOConfig(
        output_dir=str(tmp_path),
        preset="collm",
        max_grad_norm=None,
        per_device_train_batch_size=4,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        agent_names=["alice", "bob"],
    )
    dataset = Dataset.from_dict({"prompt": ["p"] * 4})
    trainer = MultiAgentPPOTrainer(
        args=args,
        processing_class=tok,
        model=policies,
        value_model=critic_model,
        train_dataset=dataset,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        optimizers=(torch.optim.SGD(params, lr=eta), None),
    )
    trainer._batch_sizes()
    trainer.create_optimizer_and_scheduler(num_training_steps=10)

    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])
    responses = {"alice": [[2, 3], [4], [2, 2, 6], [5, 3]], "bob": [[1], [3, 4], [6, 6], [2]]}
    turn = {
        a: AgentTurn(a, 0, torch.arange(4), ["p"] * 4, [f"{a} prompt {k}" for k in range(4)], generation(responses[a]))
        for a in responses
    }
    roll = Rollout(
        ["alice", "bob"],
        [{}] * 4,
        [turn],
        rewards.view(4, 1, 1).expand(4, 1, 2).clone(),
        torch.ones(4, 1, dtype=torch.bool),
    )

    # ---- expected, by hand
    v0 = w0 + b0
    delta = rewards - v0  # one turn: V(next) = 0
    adv = (delta - delta.mean()) / delta.std(unbiased=False).clamp(min=1e-6)
    expected_theta = [reinforce_step(theta, responses[a], adv, eta) for a, theta in zip(["alice", "bob"], thetas)]
    w, b = w0, b0
    for _ in range(2):  # the shared critic is stepped once per agent
        g = 1.2 * float((w + b - rewards).mean())  # d/dv of 0.6 * mean (v - r)^2, and dv/dw = dv/db = 1
        w, b = w - eta * g, b - eta * g

    scored = trainer.score_rollout(roll)
    assert torch.allclose(scored.advantages.targets[0].old_values.flatten(), torch.full((4,), v0))
    assert torch.allclose(scored.turns[0]["alice"].advantages, adv, atol=1e-6)
    trainer.model.train()
    trainer.update(scored)

    for policy, expected in zip(policies, expected_theta):
        assert torch.allclose(policy.theta.detach(), expected, atol=1e-6), (policy.theta, expected)
    assert abs(float(critic_model.score.weight) - w) < 1e-6
    assert abs(float(critic_model.score.bias) - b) < 1e-6
    # and the parameters really moved (the check above is not vacuous)
    assert not torch.allclose(policies[0].theta.detach(), torch.tensor(thetas[0]))
