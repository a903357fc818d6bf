"""Configuration dataclasses.

`TeamConfig` holds what both trainers share (the team, generation, rewards, episodes); it derives from TRL's
`_BaseConfig` (itself a `transformers.TrainingArguments`), so every config is also a command line through
`HfArgumentParser` / `TrlParser`. `MultiAgentPPOConfig` keeps every field name and default of TRL's last `PPOConfig`
(TRL <= 1.12), so a script written for that trainer parses the same flags. `MultiAgentMCConfig` is the critic-free
Monte-Carlo baseline's.
TRL's `world_size` field is deliberately *not* re-declared: it shadowed `TrainingArguments.world_size` and broke
DeepSpeed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field, fields

from trl.trainer.base_config import _BaseConfig

# One word selects the paper's reference update rule (comlrl 1.3.2). Every key here is a field of the config;
# values are applied in __post_init__ and documented in docs/presets.md.
PRESETS: dict[str, dict] = {
    "collm": dict(
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
    "critic_type": ("centralized", "decentralized"),
    "critic_placement": ("separate", "actor_head", "shared_base_adapter"),
    "centralized_value": ("team", "per_agent_heads", "agent_tagged"),
    "advantage_level": ("turn", "token"),
    "critic_updates": ("joint", "per_agent"),
    "reward_type": ("auto", "joint", "per_agent"),
    "advantage_norm_scope": ("agent_turn", "agent", "batch", "none"),
    "policy_loss_type": ("ppo", "reinforce"),
    "grad_clip_scope": ("global", "per_module"),
    "kl_estimator": ("k1", "k3"),
    "agent_context": ("observation", "history"),
}


MC_PRESETS: dict[str, dict] = {
    # MAGRPO's update rule (comlrl 1.3.2, arXiv 2508.04652): return minus the group mean (no std scaling), REINFORCE on
    # the completion's summed log-probability, no ratio / clipping / KL, one step per (agent, turn) group.
    "magrpo": dict(
        baseline="mean",
        scale_advantages=False,
        loss_type="reinforce",
        num_iterations=1,
        beta=0.0,
        gamma=0.9,
        learning_rate=5e-6,
        max_grad_norm=None,
        update_schedule="per_agent_turn",
        scale_logits_by_temperature=False,
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        num_generations=4,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    ),
}

_MC_CHOICES = {
    "joint_mode": ("aligned", "cross"),
    "expansion": ("tree", "per_branch"),
    "baseline": ("mean", "loo", "max", "none"),
    "loss_type": ("reinforce", "clipped"),
    "update_schedule": ("joint", "per_agent_turn"),
    "kl_estimator": ("k1", "k3"),
}


@dataclass
class TeamConfig(_BaseConfig):
    """Fields shared by the team trainers: episodes, generation, rewards and the team itself."""

    presets = {}  # class attribute (not a field): name -> {field: value}

    exp_name: str = field(
        default=os.path.basename(sys.argv[0])[: -len(".py")] if sys.argv and sys.argv[0].endswith(".py") else "trl_collm",
        metadata={"help": "Name of this experiment."},
    )
    learning_rate: float = field(default=3e-6, metadata={"help": "Learning rate (actors; critics too unless `critic_learning_rate`)."})
    run_name: str | None = field(default=None, metadata={"help": "Name of the run."})
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Number of processes to use for processing the dataset."})
    num_mini_batches: int = field(default=1, metadata={"help": "Number of minibatches to split a batch into."})
    total_episodes: int | None = field(
        default=None, metadata={"help": "Total number of episodes in the dataset. Defaults to num_train_epochs * len(train_dataset)."}
    )
    local_rollout_forward_batch_size: int = field(
        default=64, metadata={"help": "Per rank no grad forward pass in the rollout phase."}
    )
    num_sample_generations: int = field(
        default=10, metadata={"help": "Number of debugging samples generations (i.e., `generate_completions` calls) throughout training."}
    )
    response_length: int = field(default=53, metadata={"help": "Length of the response (max new tokens)."})
    stop_token: str | None = field(default=None, metadata={"help": "Specifies the stop token to use for text generation. Only 'eos' is supported."})
    stop_token_id: int | None = field(default=None, metadata={"help": "Specifies the ID of the stop token to use for text generation."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature."})
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Penalty subtracted from the score of responses that do not end with the stop/EOS token."}
    )
    num_total_batches: int | None = field(default=None, metadata={"help": "Number of total PPO batches (computed at runtime)."})
    micro_batch_size: int | None = field(default=None, metadata={"help": "Micro batch size across devices (computed at runtime)."})
    local_batch_size: int | None = field(default=None, metadata={"help": "Batch size per GPU (computed at runtime)."})
    batch_size: int | None = field(default=None, metadata={"help": "Batch size across devices (computed at runtime)."})
    local_mini_batch_size: int | None = field(default=None, metadata={"help": "Mini batch size per GPU (computed at runtime)."})
    mini_batch_size: int | None = field(default=None, metadata={"help": "Mini batch size across GPUs (computed at runtime)."})
    push_to_hub: bool = field(default=False, metadata={"help": "Whether to push the model to the Hub after training."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor."})
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Gather ZeRO-3 weights for generation (faster; set False for models that do not fit on one device)."}
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={"help": "Compute the leading tokens that all rows of a training forward share (a task's instructions, the G "
                  "samples of one prompt) once instead of once per row. Same numbers up to float rounding; falls back to "
                  "the plain forward where it cannot apply (see trl_collm/prefix.py)."},
    )

    # ------------------------------------------------------------------ generation backend (issue 16, `speed` branch)
    # One block on purpose: the configs are moving (arch refactor); port it as a whole. TRL 1.16's GRPOConfig names
    # and types. Read by trl_collm/generation.py (`make_backend`); documented in docs/generation.md.
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={"help": "Generate rollouts with transformers' continuous batching (`generate_batch`: paged KV cache, "
                  "continuous batching, CUDA graphs on GPU) instead of `generate()`. LoRA teams run one call per adapter. "
                  "Same sampling settings, stop token and response_length (see docs/generation.md)."},
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for `transformers.generation.ContinuousBatchingConfig` (a dict or JSON "
                  "string). Default on GPU: max_memory_percent=0.5, as in TRL; on CPU the cache is sized to each call."},
    )
    # ------------------------------------------------------------------ end of the generation-backend block


    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Longest agent prompt in tokens; longer prompts keep their last tokens (with a warning). "
                  "Default: the model's context length minus response_length. Critic views are cut to the critic's context."},
    )
    model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for from_pretrained when models are given as paths (e.g. {\"dtype\": \"bfloat16\"})."},
    )
    # TRL's base turns activation checkpointing on; RL alternates generation and training forwards, so we leave it
    # off unless asked (`--activation_checkpointing`). None keeps transformers from warning about the old name.
    gradient_checkpointing: bool | None = field(default=None, metadata={"help": "Deprecated alias of activation_checkpointing."})

    # ------------------------------------------------------------------ the team
    agent_names: list[str] | None = field(
        default=None, metadata={"help": "Names of the agents (used in logs, folders, cards). Defaults to agent_0..agent_{n-1}."}
    )
    num_agents: int | None = field(default=None, metadata={"help": "Number of agents when `model` is one path or model to replicate."})
    num_turns: int = field(default=1, metadata={"help": "Maximum number of turns per episode."})
    agent_context: str = field(
        default="observation",
        metadata={"help": "What an agent is prompted with at turn t: 'observation' (the env's text, which may embed history) "
                  "or 'history' (its own previous observations and completions followed by the new observation)."},
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling for generation."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling for generation (None: off)."})
    scale_logits_by_temperature: bool = field(
        default=True, metadata={"help": "Compute log-probs from logits / temperature (TRL PPO) or from raw logits (reference code)."}
    )
    reward_weights: list[float] | None = field(default=None, metadata={"help": "Weights of the reward functions (default 1.0 each)."})
    reward_type: str = field(
        default="auto",
        metadata={"help": "'joint' (one reward per episode shared by all agents), 'per_agent' (a vector of n), or 'auto' (accept both)."},
    )
    early_termination_threshold: float | None = field(
        default=None, metadata={"help": "End an episode early once the mean reward of a turn exceeds this value."}
    )

    grad_clip_scope: str = field(
        default="global", metadata={"help": "'global': one grad-norm clip over everything; 'per_module': each agent and critic clipped on its own."}
    )
    preset: str | None = field(default=None, metadata={"help": "One word that sets the update rule (see docs/algorithm.md)."})

    def __post_init__(self):
        if isinstance(self.model_init_kwargs, str):
            self.model_init_kwargs = json.loads(self.model_init_kwargs)
        if self.preset is not None:
            if self.preset not in self.presets:
                raise ValueError(f"`preset`={self.preset!r} is unknown; choose one of {sorted(self.presets)} or leave it unset.")
            # A preset fills the fields the user left at their defaults; anything set explicitly wins.
            defaults = {f.name: f.default for f in fields(self)}
            for key, value in self.presets[self.preset].items():
                if getattr(self, key) == defaults[key]:
                    setattr(self, key, value)
        super().__post_init__()
        self._validate()

    def resolve_for_team(self, num_agents: int) -> None:
        """Fill the team-dependent defaults (called by the trainer once it knows the team)."""

    def uses_reference(self) -> bool:
        """Whether a reference policy is needed (a KL term)."""
        return False

    def _check_choices(self, choices: dict) -> None:
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value is None and name in ("critic_placement", "advantage_level"):
                continue  # None: decided by the trainer from the team
            if value not in allowed:
                raise ValueError(f"`{name}`={value!r} is not valid; choose one of {list(allowed)}.")

    def _validate(self):
        self._check_choices({k: _CHOICES[k] for k in ("reward_type", "grad_clip_scope", "agent_context")})
        for name in ("num_turns", "num_mini_batches", "response_length", "local_rollout_forward_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        if self.num_agents is not None and self.num_agents < 1:
            raise ValueError(f"`num_agents` must be >= 1, got {self.num_agents}.")
        if self.agent_names is not None:
            if len(set(self.agent_names)) != len(self.agent_names):
                raise ValueError(f"`agent_names` must be unique, got {self.agent_names}.")
            bad = [n for n in self.agent_names if not n or "/" in n or n.startswith(".") or n in ("critic", "critics")]
            if bad:
                raise ValueError(f"`agent_names` {bad} cannot be used as folder names; use names without '/' that are not 'critic'.")
            if self.num_agents is not None and self.num_agents != len(self.agent_names):
                raise ValueError(
                    f"`num_agents`={self.num_agents} but `agent_names` has {len(self.agent_names)} names; drop one of them or make them agree."
                )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"`gamma` must be in [0, 1], got {self.gamma}.")
        if self.temperature <= 0:
            raise ValueError(f"`temperature` must be > 0, got {self.temperature}.")
        if self.stop_token is not None and self.stop_token != "eos":
            raise ValueError(f"`stop_token`={self.stop_token!r}: only 'eos' is supported (or set `stop_token_id`).")
        if self.reward_weights is not None and any(not math.isfinite(w) for w in self.reward_weights):
            raise ValueError(f"`reward_weights` must be finite numbers, got {self.reward_weights}.")


@dataclass
class MultiAgentPPOConfig(TeamConfig):
    r"""Configuration of [`MultiAgentPPOTrainer`].

    With the shared fields of `TeamConfig`, it repeats every field of TRL's last `PPOConfig` (same names, same
    defaults), and adds the critic layout and the update rule. Derived batch sizes (`batch_size`,
    `mini_batch_size`, ...) are filled in by the trainer, as TRL's PPO did.
    """

    presets = PRESETS

    # ------------------------------------------------------------------ TRL PPOConfig fields (same defaults)
    sft_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the SFT model."})
    reward_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the reward model."})
    model_adapter_name: str | None = field(default=None, metadata={"help": "Name of the train target PEFT adapter, when using LoRA with multiple adapters."})
    ref_adapter_name: str | None = field(default=None, metadata={"help": "Name of the reference PEFT adapter, when using LoRA with multiple adapters."})
    num_ppo_epochs: int = field(default=4, metadata={"help": "Number of epochs to train."})
    whiten_rewards: bool = field(default=False, metadata={"help": "Whether to whiten the rewards."})
    kl_coef: float = field(default=0.05, metadata={"help": "KL coefficient."})
    kl_estimator: str = field(default="k1", metadata={"help": "KL estimator: 'k1' (unbiased, high variance) or 'k3' (unbiased, lower variance)."})
    cliprange: float | None = field(default=0.2, metadata={"help": "Clip range (None: no clipping)."})
    vf_coef: float = field(default=0.1, metadata={"help": "Value function coefficient."})
    cliprange_value: float | None = field(default=0.2, metadata={"help": "Clip range for the value function (None: no clipping)."})
    lam: float = field(default=0.95, metadata={"help": "Lambda value for GAE."})    # ------------------------------------------------------------------ the critic
    critic_type: str = field(
        default="centralized",
        metadata={"help": "'centralized' (CoLLM-CC: one critic over the joint view) or 'decentralized' (CoLLM-DC: one critic per agent over its own view)."},
    )
    critic_placement: str | None = field(
        default=None,
        metadata={"help": "'separate' (a value model), 'actor_head' (a value head on an actor's backbone) or 'shared_base_adapter' "
                  "(LoRA adapter + head on the shared base). Default: 'separate' when a value_model is given, 'shared_base_adapter' for a "
                  "shared-base team, else 'separate'."},
    )
    centralized_value: str = field(
        default="per_agent_heads",
        metadata={"help": "Centralized critic output: 'team' (one value for the team, as the reference), 'per_agent_heads' (one head per agent), "
                  "or 'agent_tagged' (one head, the view tagged with the agent it values)."},
    )
    critic_sees_joint_action: bool = field(
        default=False, metadata={"help": "Centralized critic also reads the other agents' current completions (the reference's Q-variant)."}
    )
    critic_backbone_agent: str | None = field(
        default=None, metadata={"help": "For critic_placement='actor_head' with a centralized critic: whose backbone carries the head (default: first agent)."}
    )
    critic_learning_rate: float | None = field(default=None, metadata={"help": "Learning rate of the critic parameters (default: learning_rate)."})
    critic_updates: str = field(
        default="joint",
        metadata={"help": "'joint': one optimizer step per minibatch for actors and critic together; 'per_agent': the critic is stepped once "
                  "per agent (and turn) group, as the reference code does."},
    )
    value_normalization: bool = field(default=False, metadata={"help": "Train the critic on running-normalised returns."})

    # ------------------------------------------------------------------ the update rule
    advantage_level: str | None = field(
        default=None,
        metadata={"help": "'turn': the completion is one action valued at the end of its prompt (paper); 'token': per-token values, KL and GAE "
                  "(TRL PPO). Default: 'token' for a single agent (TRL PPO semantics), 'turn' for a team."},
    )
    advantage_norm_scope: str = field(
        default="agent_turn", metadata={"help": "Where advantages are whitened: 'agent_turn', 'agent', 'batch' or 'none'."}
    )
    advantage_norm_std_floor: float | None = field(
        default=None, metadata={"help": "If set, advantages are divided by max(population std, floor) (reference) instead of sqrt(var + 1e-8)."}
    )
    policy_loss_type: str = field(default="ppo", metadata={"help": "'ppo' (clipped ratio surrogate) or 'reinforce' (reference rule)."})
    preset: str | None = field(
        default=None,
        metadata={"help": "One word that sets the update rule: 'collm' (the paper's reference rule, comlrl 1.3.2) or 'collm-1.4' (gamma 1.0, no grad clip)."},
    )

    def resolve_for_team(self, num_agents: int) -> None:
        if self.advantage_level is None:
            self.advantage_level = "token" if num_agents == 1 else "turn"
        self.check_advantage_level()

    def uses_reference(self) -> bool:
        return self.kl_coef != 0

    def check_advantage_level(self) -> None:
        if self.advantage_level != "token":
            return
        if self.critic_type == "centralized" and self.centralized_value == "team":
            raise ValueError(
                "`advantage_level='token'` needs a value per agent token; set `centralized_value='per_agent_heads'` or 'agent_tagged'."
            )
        if self.num_turns > 1:
            raise ValueError("`advantage_level='token'` supports `num_turns=1`; use advantage_level='turn' for multi-turn episodes.")

    def _validate(self):
        super()._validate()
        self._check_choices({k: v for k, v in _CHOICES.items() if k not in ("reward_type", "grad_clip_scope", "agent_context")})
        if self.num_ppo_epochs < 1:
            raise ValueError(f"`num_ppo_epochs` must be >= 1, got {self.num_ppo_epochs}.")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"`lam` must be in [0, 1], got {self.lam}.")
        if self.cliprange is not None and self.cliprange <= 0:
            raise ValueError(f"`cliprange` must be > 0 or None, got {self.cliprange}.")
        self.check_advantage_level()
        if self.reward_type == "per_agent" and self.critic_type == "centralized" and self.centralized_value == "team":
            raise ValueError(
                "`reward_type='per_agent'` with one team value cannot credit agents separately; set `centralized_value='per_agent_heads'`."
            )
        if self.policy_loss_type == "reinforce" and self.num_ppo_epochs > 1:
            raise ValueError(
                "`policy_loss_type='reinforce'` is on-policy (no ratio); set `num_ppo_epochs=1` or use `policy_loss_type='ppo'`."
            )


@dataclass
class MultiAgentMCConfig(TeamConfig):
    r"""Configuration of [`MultiAgentMCTrainer`], the Monte-Carlo (critic-free) team baseline (MAGRPO-style).

    `per_device_train_batch_size` counts dataset rows (prompts) per device and iteration; each row becomes
    `num_generations` samples per agent (and, in tree mode, `num_generations` children per node and turn).
    """

    presets = MC_PRESETS

    learning_rate: float = field(default=5e-6, metadata={"help": "Learning rate of the agents."})
    num_generations: int = field(default=4, metadata={"help": "G: completions sampled per agent per prompt (per tree node)."})
    joint_mode: str = field(
        default="aligned",
        metadata={"help": "'aligned': the g-th samples of all agents form the g-th joint action (G joint actions); 'cross': every "
                  "combination of the agents' samples (capped by max_joint_combinations), each sample credited with the mean "
                  "return of the combinations it took part in (single-turn only)."},
    )
    max_joint_combinations: int = field(default=16, metadata={"help": "Cap on the joint actions per prompt in 'cross' mode (sampled when exceeded)."})
    expansion: str = field(
        default="tree",
        metadata={"help": "Multi-turn: 'tree' (every node samples G children: G^T leaves per prompt) or 'per_branch' (G independent "
                  "branches per prompt: G*T generations)."},
    )
    baseline: str = field(default="mean", metadata={"help": "Group baseline: 'mean', 'loo' (leave-one-out mean), 'max' or 'none'."})
    scale_advantages: bool = field(default=False, metadata={"help": "Divide advantages by the group's std (GRPO-style)."})
    loss_type: str = field(
        default="reinforce",
        metadata={"help": "'reinforce' (on-policy, -(sum of log-probs) * A, no ratio/clip) or 'clipped' (ratio surrogate over num_iterations)."},
    )
    num_iterations: int = field(default=1, metadata={"help": "Inner iterations over each batch (loss_type='clipped')."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the ratio (loss_type='clipped')."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the reference policy (0: no reference is kept)."})
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator for beta: 'k1' or 'k3'."})
    update_schedule: str = field(
        default="joint",
        metadata={"help": "'joint': one optimizer step per minibatch for all agents; 'per_agent_turn': one step per (agent, turn) group (MAGRPO)."},
    )
    preset: str | None = field(default=None, metadata={"help": "'magrpo': MAGRPO's update rule (see docs/algorithm.md)."})

    def uses_reference(self) -> bool:
        return self.beta != 0

    def _validate(self):
        super()._validate()
        self._check_choices(_MC_CHOICES)
        if self.num_generations < 2 and self.baseline != "none":
            raise ValueError(f"`num_generations`={self.num_generations}: a group baseline needs >= 2 samples; raise it or set baseline='none'.")
        if self.num_generations < 1 or self.num_iterations < 1 or self.max_joint_combinations < 1:
            raise ValueError("`num_generations`, `num_iterations` and `max_joint_combinations` must be >= 1.")
        if self.joint_mode == "cross" and self.num_turns > 1:
            raise ValueError("`joint_mode='cross'` is single-turn; use joint_mode='aligned' with expansion='tree' for multi-turn.")
        if self.loss_type == "reinforce" and self.num_iterations > 1:
            raise ValueError("`loss_type='reinforce'` is on-policy (no ratio); set `num_iterations=1` or use loss_type='clipped'.")
        if self.epsilon <= 0:
            raise ValueError(f"`epsilon` must be > 0, got {self.epsilon}.")
