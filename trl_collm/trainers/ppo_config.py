"""`MultiAgentPPOConfig`: the configuration of `MultiAgentPPOTrainer` (CoLLM-CC / CoLLM-DC).

It keeps every field name and default of TRL's last `PPOConfig` (TRL <= 1.12), so a script written for that trainer
parses the same flags, and adds the critic layout and the update rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..critics import check_critic_config, ignored_critic_fields
from .presets import PresetDefault, check_presettable, plain
from .ranges import ABOVE_0, AT_LEAST_0, AT_LEAST_1, UNIT
from .team_config import TeamConfig

# One word selects the paper's reference update rule (comlrl 1.3.2). Every key here is a field of the config;
# values are applied in __post_init__ and documented in docs/algorithm.md ("Presets").
PRESETS: dict[str, dict] = {
    "collm": dict(
        centralized_value="team",  # the reference's centralized critic values the team, not each agent
        advantage_level="turn",
        gamma=0.9,
        lam=0.0,  # TD(0): the advantage is the TD error delta_t
        num_ppo_epochs=1,
        policy_loss_type="reinforce",  # -(sum of completion log-probs) * advantage; no ratio, no clipping
        cliprange_value=None,
        vf_coef=1.2,  # 0.5 * 1.2 = 0.6 * squared error, the reference's value_loss_coef
        kl_coef=0.0,
        advantage_norm_scope="agent_turn",
        advantage_norm_std_floor=1e-6,  # population std clamped at 1e-6, as the reference does
        whiten_rewards=False,
        value_normalization=False,
        learning_rate=5e-6,
        max_grad_norm=0.5,
        grad_clip_scope="per_module",  # actor i and critic clipped separately (separate optimizers there)
        critic_updates="per_agent",  # the shared critic gets one step per agent (and turn) group
        scale_logits_by_temperature=False,  # reference log-probs use raw logits
        temperature=0.6,
        top_p=0.6,
        missing_eos_penalty=None,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    ),
}
# The same rule with gamma=1.0 and no gradient clipping, as in comlrl 1.4.3.
PRESETS["collm-1.4"] = dict(PRESETS["collm"], gamma=1.0, max_grad_norm=None)

_CHOICES = {
    "centralized_value": ("team", "per_agent_heads", "agent_tagged"),
    "advantage_level": ("turn", "token"),
    "critic_updates": ("joint", "per_agent"),
    "advantage_norm_scope": ("agent_turn", "agent", "batch", "none"),
    "policy_loss_type": ("ppo", "reinforce"),
    "kl_estimator": ("k1", "k3"),
}


@dataclass
class MultiAgentPPOConfig(TeamConfig):
    r"""Configuration of [`MultiAgentPPOTrainer`].

    With the shared fields of `TeamConfig`, it repeats every field of TRL's last `PPOConfig` (same names, same
    defaults), and adds the critic layout and the update rule. Derived batch sizes (`batch_size`,
    `mini_batch_size`, ...) are filled in by the trainer, as TRL's PPO did.

    Parameters:
        > Parameters that define the critic

        critic_type (`str`, *optional*, defaults to `'centralized'`):
            'centralized' (CoLLM-CC: one critic over the joint view) or 'decentralized' (CoLLM-DC: one critic per agent
            over its own view).
        critic_placement (`str`, *optional*, defaults to `None`):
            'separate' (a value model), 'actor_head' (a value head on an actor's backbone) or 'shared_base_adapter'
            (LoRA adapter + head on the shared base). Default: 'separate' when a value_model is given,
            'shared_base_adapter' for a shared-base team, else 'separate'.
        centralized_value (`str`, *optional*, defaults to `'per_agent_heads'`):
            Centralized critic output: 'team' (one value for the team, as the reference), 'per_agent_heads' (one head
            per agent), or 'agent_tagged' (one head, the view tagged with the agent it values).
        critic_sees_joint_action (`bool`, *optional*, defaults to `False`):
            Centralized critic also reads the other agents' current completions (the reference's Q-variant).
        critic_backbone_agent (`str`, *optional*, defaults to `None`):
            For critic_placement='actor_head' with a centralized critic: whose backbone carries the head (default: first
            agent).
        critic_learning_rate (`float`, *optional*, defaults to `None`):
            Learning rate of the critic parameters (default: learning_rate).
        critic_updates (`str`, *optional*, defaults to `'joint'`):
            'joint': one optimizer step per minibatch for actors and critic together; 'per_agent': the critic is stepped
            once per agent (and turn) group, as the reference code does.
        value_normalization (`bool`, *optional*, defaults to `False`):
            Train the critic on running-normalised returns.

        > Parameters that control the update rule

        preset (`str`, *optional*, defaults to `None`):
            One word that sets the update rule: 'collm' (the paper's reference rule, comlrl 1.3.2) or 'collm-1.4' (gamma
            1.0, no grad clip).
        advantage_level (`str`, *optional*, defaults to `None`):
            'turn': the completion is one action valued at the end of its prompt (paper); 'token': per-token values, KL
            and GAE (TRL PPO). Default: 'token' for a single agent (TRL PPO semantics), 'turn' for a team.
        advantage_norm_scope (`str`, *optional*, defaults to `'agent_turn'`):
            Where advantages are whitened: 'agent_turn', 'agent', 'batch' or 'none'.
        advantage_norm_std_floor (`float`, *optional*, defaults to `None`):
            If set, advantages are divided by max(population std, floor) (reference) instead of sqrt(var + 1e-8).
        policy_loss_type (`str`, *optional*, defaults to `'ppo'`):
            'ppo' (clipped ratio surrogate) or 'reinforce' (reference rule).
        num_ppo_epochs (`int`, *optional*, defaults to `4`):
            Number of epochs to train.
        cliprange (`float`, *optional*, defaults to `0.2`):
            Clip range (None: no clipping).
        vf_coef (`float`, *optional*, defaults to `0.1`):
            Value function coefficient.
        cliprange_value (`float`, *optional*, defaults to `0.2`):
            Clip range for the value function (None: no clipping).
        lam (`float`, *optional*, defaults to `0.95`):
            Lambda value for GAE.
        whiten_rewards (`bool`, *optional*, defaults to `False`):
            Whether to whiten the rewards.
        kl_coef (`float`, *optional*, defaults to `0.05`):
            KL coefficient.
        kl_estimator (`str`, *optional*, defaults to `'k1'`):
            KL estimator: 'k1' (unbiased, high variance) or 'k3' (unbiased, lower variance).

        > Parameters that switch the iteration's shortcuts (trl_collm/trainers/plan.py says when each applies)

        old_logprobs_from_update (`bool`, *optional*, defaults to `True`):
            When the update's first forward sees the sampling weights, each row once (one epoch, one minibatch) and
            no KL term needs them up front, take the old log-probs from that forward (detached: the ratio is 1
            there) instead of a scoring forward. Same numbers; False: always a scoring forward.
        old_logprobs_from_sampler (`bool`, *optional*, defaults to `True`):
            Otherwise take them from the sampler, which records the log-probs of what it samples (when the logits
            are the model's and the backend records them). Equal up to float rounding; False: a scoring forward.
        reuse_value_forward (`bool`, *optional*, defaults to `True`):
            When the iteration takes one optimizer step that sees every row once (one epoch, one minibatch, the
            joint schedule) with turn-level advantages, no value normalisation, no activation checkpointing and no
            DeepSpeed, the scoring pass runs the critic's only forward, with gradients, in chunks of
            `value_micro_batch_size` episodes, and backpropagates each chunk's value loss at once: the advantages
            come from the detached values, and the update adds the policy losses' gradients to the critic's. Same
            numbers up to float rounding, one critic forward fewer, and the critic's activations are never held
            for more than one chunk. False: a scoring forward and the update's own.
        value_micro_batch_size (`int`, *optional*, defaults to `2`):
            Episodes per critic forward and value-loss backward in the scoring pass when `reuse_value_forward`
            applies (each episode with all its turns, since a turn's target reads the next turn's value). Lower:
            less memory; higher: larger products.

        > Fields kept from TRL's PPOConfig for compatibility (not read by this trainer)

        sft_model_path (`str`, *optional*, defaults to `'EleutherAI/pythia-160m'`):
            Path to the SFT model.
        reward_model_path (`str`, *optional*, defaults to `'EleutherAI/pythia-160m'`):
            Path to the reward model.
        model_adapter_name (`str`, *optional*, defaults to `None`):
            Name of the train target PEFT adapter, when using LoRA with multiple adapters.
        ref_adapter_name (`str`, *optional*, defaults to `None`):
            Name of the reference PEFT adapter, when using LoRA with multiple adapters.
    """

    presets = PRESETS

    # ------------------------------------------------------------------ TRL PPOConfig fields (same defaults)
    sft_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the SFT model."})
    reward_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the reward model."})
    model_adapter_name: str | None = field(
        default=None,
        metadata={"help": "Name of the train target PEFT adapter, when using LoRA with multiple adapters."},
    )
    ref_adapter_name: str | None = field(
        default=None, metadata={"help": "Name of the reference PEFT adapter, when using LoRA with multiple adapters."}
    )
    num_ppo_epochs: Annotated[int, AT_LEAST_1] = field(
        default=PresetDefault(4), metadata={"help": "Number of epochs to train."}
    )
    whiten_rewards: bool = field(default=PresetDefault(False), metadata={"help": "Whether to whiten the rewards."})
    kl_coef: Annotated[float, AT_LEAST_0] = field(default=PresetDefault(0.05), metadata={"help": "KL coefficient."})
    kl_estimator: str = field(
        default="k1",
        metadata={"help": "KL estimator: 'k1' (unbiased, high variance) or 'k3' (unbiased, lower variance)."},
    )
    cliprange: Annotated[float | None, ABOVE_0] = field(
        default=0.2, metadata={"help": "Clip range (None: no clipping)."}
    )
    vf_coef: Annotated[float, AT_LEAST_0] = field(
        default=PresetDefault(0.1), metadata={"help": "Value function coefficient."}
    )
    cliprange_value: Annotated[float | None, ABOVE_0] = field(
        default=PresetDefault(0.2), metadata={"help": "Clip range for the value function (None: no clipping)."}
    )
    lam: Annotated[float, UNIT] = field(default=PresetDefault(0.95), metadata={"help": "Lambda value for GAE."})

    # ------------------------------------------------------------------ the critic
    critic_type: str = field(
        default="centralized",
        metadata={
            "help": (
                "'centralized' (CoLLM-CC: one critic over the joint view) or 'decentralized' (CoLLM-DC: one "
                "critic per agent over its own view)."
            )
        },
    )
    critic_placement: str | None = field(
        default=None,
        metadata={
            "help": (
                "'separate' (a value model), 'actor_head' (a value head on an actor's backbone) or "
                "'shared_base_adapter' "
                "(LoRA adapter + head on the shared base). Default: 'separate' when a value_model is given, "
                "'shared_base_adapter' for a "
                "shared-base team, else 'separate'."
            )
        },
    )
    centralized_value: str = field(
        default=PresetDefault("per_agent_heads"),
        metadata={
            "help": (
                "Centralized critic output: 'team' (one value for the team, as the reference), "
                "'per_agent_heads' (one head per agent), "
                "or 'agent_tagged' (one head, the view tagged with the agent it values)."
            )
        },
    )
    critic_sees_joint_action: bool = field(
        default=False,
        metadata={
            "help": "Centralized critic also reads the other agents' current completions (the reference's Q-variant)."
        },
    )
    critic_backbone_agent: str | None = field(
        default=None,
        metadata={
            "help": (
                "For critic_placement='actor_head' with a centralized critic: whose backbone carries the head "
                "(default: first agent)."
            )
        },
    )
    critic_learning_rate: Annotated[float | None, AT_LEAST_0] = field(
        default=None, metadata={"help": "Learning rate of the critic parameters (default: learning_rate)."}
    )
    critic_updates: str = field(
        default=PresetDefault("joint"),
        metadata={
            "help": (
                "'joint': one optimizer step per minibatch for actors and critic together; 'per_agent': the "
                "critic is stepped once "
                "per agent (and turn) group, as the reference code does."
            )
        },
    )
    value_normalization: bool = field(
        default=PresetDefault(False), metadata={"help": "Train the critic on running-normalised returns."}
    )

    # ------------------------------------------------------------------ the update rule
    advantage_level: str | None = field(
        default=PresetDefault(None),
        metadata={
            "help": (
                "'turn': the completion is one action valued at the end of its prompt (paper); 'token': "
                "per-token values, KL and GAE "
                "(TRL PPO). Default: 'token' for a single agent (TRL PPO semantics), 'turn' for a team."
            )
        },
    )
    advantage_norm_scope: str = field(
        default=PresetDefault("agent_turn"),
        metadata={"help": "Where advantages are whitened: 'agent_turn', 'agent', 'batch' or 'none'."},
    )
    advantage_norm_std_floor: Annotated[float | None, ABOVE_0] = field(
        default=PresetDefault(None),
        metadata={
            "help": (
                "If set, advantages are divided by max(population std, floor) (reference) instead of sqrt(var + 1e-8)."
            )
        },
    )
    policy_loss_type: str = field(
        default=PresetDefault("ppo"),
        metadata={"help": "'ppo' (clipped ratio surrogate) or 'reinforce' (reference rule)."},
    )
    # ------------------------------------------------------------------ the iteration's shortcuts (trainers/plan.py)
    old_logprobs_from_update: bool = field(
        default=True,
        metadata={
            "help": (
                "Take the old log-probs from the update's first forward (detached) when it sees the sampling weights, "
                "each row once, and no KL term needs them up front (see trl_collm/trainers/plan.py). False: a "
                "scoring forward."
            )
        },
    )
    old_logprobs_from_sampler: bool = field(
        default=True,
        metadata={
            "help": (
                "Otherwise take them from the sampler, which records them while sampling (logits as the model gives "
                "them, a backend that records them). False: a scoring forward."
            )
        },
    )
    reuse_value_forward: bool = field(
        default=True,
        metadata={
            "help": (
                "When the iteration's one optimizer step sees every row once, the scoring pass runs the critic's only "
                "forward, with gradients, and backpropagates its value loss in chunks of value_micro_batch_size "
                "episodes (see trl_collm/trainers/plan.py). False: a scoring forward and the update's own."
            )
        },
    )
    value_micro_batch_size: Annotated[int, AT_LEAST_1] = field(
        default=2,
        metadata={
            "help": (
                "Episodes per critic forward and value-loss backward in the scoring pass (reuse_value_forward). "
                "Lower: less memory; higher: larger products."
            )
        },
    )
    preset: str | None = field(
        default=None,
        metadata={
            "help": (
                "One word that sets the update rule: 'collm' (the paper's reference rule, comlrl 1.3.2) or "
                "'collm-1.4' (gamma 1.0, no grad clip)."
            )
        },
    )

    def preset_fields(self) -> dict:
        fields = super().preset_fields()
        # Read before the defaults are filled: advantage_level may still be its PresetDefault (None).
        if self.reward_type == "per_agent" or plain(self.advantage_level) == "token":
            # One team value cannot credit per-agent rewards or value tokens: keep a value per agent there.
            fields.pop("centralized_value", None)
        for name in ignored_critic_fields(plain(self.critic_type)):  # e.g. a DC critic reads no centralized_value
            fields.pop(name, None)
        return fields

    def resolve_for_team(self, num_agents: int) -> None:
        if self.advantage_level is None:
            self.advantage_level = "token" if num_agents == 1 else "turn"
        self.check_advantage_level()

    def uses_reference(self) -> bool:
        return self.kl_coef != 0

    def check_advantage_level(self) -> None:
        check_critic_config(self)  # the critic layout says which of its options the advantage level needs
        if self.advantage_level != "token":
            return
        if self.num_turns > 1:
            raise ValueError(
                "`advantage_level='token'` supports `num_turns=1`; use advantage_level='turn' for multi-turn episodes."
            )

    def _validate(self):
        super()._validate()
        self.check_advantage_level()  # runs check_critic_config: the critic package knows its types and placements
        self._check_choices(_CHOICES, optional=("advantage_level",))
        if self.policy_loss_type == "reinforce" and self.num_ppo_epochs > 1:
            raise ValueError(
                "`policy_loss_type='reinforce'` is on-policy (no ratio); set `num_ppo_epochs=1` or use "
                "`policy_loss_type='ppo'`."
            )


check_presettable(MultiAgentPPOConfig, PRESETS)
