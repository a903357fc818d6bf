"""`MultiAgentMCConfig`: the configuration of `MultiAgentMCTrainer`, the Monte-Carlo (critic-free) team baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..generation.sampler import SamplingSettings
from .grpo_fields import OTHER_GRPO_LOSS_TYPES, GRPORefusedFields, check_grpo_fields
from .presets import PresetDefault, check_presettable
from .ranges import ABOVE_0, AT_LEAST_0, AT_LEAST_1, UNIT
from .team_config import TeamConfig

GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = {"group": "group", "batch": "batch", "none": "none", "true": "group", "false": "none"}

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
    "loss_type": ("reinforce", "clipped", *GRPO_LOSS_TYPES),
    "update_schedule": ("joint", "per_agent_turn"),
    "kl_estimator": ("k1", "k3"),
}


@dataclass
class MultiAgentMCConfig(GRPORefusedFields, TeamConfig):
    r"""Configuration of [`MultiAgentMCTrainer`], the Monte-Carlo (critic-free) team baseline (MAGRPO-style).

    `per_device_train_batch_size` counts dataset rows (prompts) per device and iteration; each row becomes
    `num_generations` samples per agent (and, in tree mode, `num_generations` children per node and turn). With the
    shared fields of `TeamConfig`:

    Parameters:
        > Parameters that control sampling

        num_generations (`int`, *optional*, defaults to `4`):
            G: completions sampled per agent per prompt (per tree node).
        joint_mode (`str`, *optional*, defaults to `'aligned'`):
            'aligned': the g-th samples of all agents form the g-th joint action (G joint actions); 'cross': every
            combination of the agents' samples (capped by max_joint_combinations), each sample credited with the mean
            return of the combinations it took part in (single-turn only).
        max_joint_combinations (`int`, *optional*, defaults to `16`):
            Cap on the joint actions per prompt in 'cross' mode (sampled when exceeded).
        expansion (`str`, *optional*, defaults to `'tree'`):
            Multi-turn: 'tree' (every node samples G children: G^T leaves per prompt) or 'per_branch' (G independent
            branches per prompt: G*T generations).

        > Parameters that control the update rule

        preset (`str`, *optional*, defaults to `None`):
            'magrpo': MAGRPO's update rule (see docs/algorithm.md).
        learning_rate (`float`, *optional*, defaults to `5e-06`):
            Learning rate of the agents.
        baseline (`str`, *optional*, defaults to `'mean'`):
            Group baseline: 'mean', 'loo' (leave-one-out mean), 'max' or 'none'.
        scale_advantages (`bool`, *optional*, defaults to `False`):
            Divide advantages by the group's std (GRPO-style).
        scale_rewards (`str`, *optional*, defaults to `None`):
            GRPO's advantage scaling: 'group' (std of the agent's G samples of one prompt), 'batch' (std of the agent's
            batch) or 'none'; true / false mean 'group' / 'none'. GRPO's std (unbiased, + 1e-4). None: as
            scale_advantages says.
        loss_type (`str`, *optional*, defaults to `'reinforce'`):
            'reinforce' (on-policy, -(sum of log-probs) * A, no ratio/clip), 'clipped' (ratio surrogate over
            num_iterations), or GRPO's 'grpo' (each completion's token mean, averaged), 'bnpo' (the micro-batch's
            token mean), 'dr_grpo' (token sum over rows x max_completion_length), 'dapo' (token sum over the
            minibatch's tokens); a GRPO loss is each agent's own, the agents' losses are summed.
        max_completion_length (`int`, *optional*, defaults to `None`):
            GRPO's name of response_length (max new tokens); both set: they must agree.
        generation_batch_size (`int`, *optional*, defaults to `None`):
            GRPO's: completions per agent sampled per iteration over all processes; sets num_mini_batches to
            generation_batch_size / (per_device_train_batch_size x num_generations x processes x
            gradient_accumulation_steps).
        steps_per_generation (`int`, *optional*, defaults to `None`):
            GRPO's: micro-batches per generation; sets num_mini_batches to steps_per_generation /
            gradient_accumulation_steps.
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            A completion without its stop token carries no loss (its reward still enters the advantages).
        use_bias_correction_kl (`bool`, *optional*, defaults to `True`):
            GRPO loss types: the KL term is multiplied by the ratio (GRPO's importance-sampling correction of the KL).
        epsilon_high (`float`, *optional*, defaults to `None`):
            Upper clip range of the ratio (GRPO loss types; default: epsilon).
        delta (`float`, *optional*, defaults to `None`):
            GRPO loss types: two-sided clipping, the ratio capped at delta.
        min_p (`float`, *optional*, defaults to `None`):
            GRPO's: keep only tokens at least min_p times as likely as the most likely one (after the temperature);
            None or 0: off. Recorded in team.json, so eval / play sample with it.
        repetition_penalty (`float`, *optional*, defaults to `1.0`):
            GRPO's: penalise tokens already in the prompt or the completion (> 1 discourages repeats; 1.0: off), in
            generate() and vLLM alike. The loss's log-probs stay the policy's own (not the penalised ones).
        generation_kwargs (`dict`, *optional*, defaults to `None`):
            GRPO's: further keyword arguments for generate() (GenerationConfig's names) or, with use_vllm, vLLM's
            SamplingParams; a JSON object on the command line. Keys that are settings here (temperature, top_p,
            max_new_tokens, ...) are refused naming the setting. Recorded in team.json.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Added to model_init_kwargs (models loaded from paths run their repository's code).
        log_completions (`bool`, *optional*, defaults to `False`):
            At each log, print the iteration's first completions of every agent with their rewards and advantages.
        num_completions_to_print (`int`, *optional*, defaults to `None`):
            Rows log_completions prints (None: 4).
        num_iterations (`int`, *optional*, defaults to `1`):
            Inner iterations over each batch (loss_type='clipped').
        epsilon (`float`, *optional*, defaults to `0.2`):
            Clip range of the ratio (loss_type='clipped').
        beta (`float`, *optional*, defaults to `0.0`):
            KL coefficient to the reference policy (0: no reference is kept).
        kl_estimator (`str`, *optional*, defaults to `'k3'`):
            KL estimator for beta: 'k1' or 'k3'.
        update_schedule (`str`, *optional*, defaults to `'joint'`):
            'joint': one optimizer step per minibatch for all agents; 'per_agent_turn': one step per (agent, turn) group
            (MAGRPO).

        > Parameters that switch the iteration's shortcuts (trl_collm/trainers/plan.py says when each applies)

        old_logprobs_from_update (`bool`, *optional*, defaults to `True`):
            Skip scoring's old log-prob forward when the update's first forward gives them: GRPO's loss types take
            the update's own log-probs (detached: the ratio is 1 there) when the iteration has one optimizer step;
            REINFORCE without a KL term reads none. Same numbers up to float rounding; False: always a scoring
            forward.
    """

    presets = MC_PRESETS

    learning_rate: Annotated[float, AT_LEAST_0] = field(
        default=PresetDefault(5e-6), metadata={"help": "Learning rate of the agents."}
    )
    num_generations: Annotated[int, AT_LEAST_1] = field(
        default=PresetDefault(4), metadata={"help": "G: completions sampled per agent per prompt (per tree node)."}
    )
    joint_mode: str = field(
        default="aligned",
        metadata={
            "help": (
                "'aligned': the g-th samples of all agents form the g-th joint action (G joint actions); "
                "'cross': every "
                "combination of the agents' samples (capped by max_joint_combinations), each sample credited with "
                "the mean "
                "return of the combinations it took part in (single-turn only)."
            )
        },
    )
    max_joint_combinations: Annotated[int, AT_LEAST_1] = field(
        default=16, metadata={"help": "Cap on the joint actions per prompt in 'cross' mode (sampled when exceeded)."}
    )
    expansion: str = field(
        default="tree",
        metadata={
            "help": (
                "Multi-turn: 'tree' (every node samples G children: G^T leaves per prompt) or 'per_branch' (G "
                "independent "
                "branches per prompt: G*T generations)."
            )
        },
    )
    baseline: str = field(
        default=PresetDefault("mean"),
        metadata={"help": "Group baseline: 'mean', 'loo' (leave-one-out mean), 'max' or 'none'."},
    )
    scale_advantages: bool = field(
        default=PresetDefault(False), metadata={"help": "Divide advantages by the group's std (GRPO-style)."}
    )
    loss_type: str = field(
        default=PresetDefault("reinforce"),
        metadata={
            "help": (
                "'reinforce' (on-policy, -(sum of log-probs) * A, no ratio/clip) or 'clipped' (ratio surrogate "
                "over num_iterations)."
            )
        },
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={"help": "GRPO's advantage scaling: 'group', 'batch' or 'none' (None: as scale_advantages says)."},
    )
    max_completion_length: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "GRPO's name of response_length; both set: they must agree."}
    )
    generation_batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "GRPO's: completions per agent per iteration (sets num_mini_batches)."}
    )
    steps_per_generation: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "GRPO's: micro-batches per generation (sets num_mini_batches)."}
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "A completion without its stop token carries no loss."}
    )
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "GRPO loss types: the KL term multiplied by the ratio."}
    )
    epsilon_high: Annotated[float | None, ABOVE_0] = field(
        default=None, metadata={"help": "Upper clip range of the ratio (GRPO loss types; default: epsilon)."}
    )
    delta: Annotated[float | None, ABOVE_0] = field(
        default=None, metadata={"help": "GRPO loss types: the ratio capped at delta (two-sided clipping)."}
    )
    min_p: Annotated[float | None, UNIT] = field(
        default=None, metadata={"help": "GRPO's min-p filter (after the temperature); None or 0: off."}
    )
    repetition_penalty: Annotated[float, ABOVE_0] = field(
        default=1.0, metadata={"help": "GRPO's: > 1 discourages tokens already in the prompt or completion; 1.0: off."}
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "GRPO's: more generate() / vLLM SamplingParams keyword arguments (a JSON object)."},
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Added to model_init_kwargs."})
    log_completions: bool = field(
        default=False, metadata={"help": "Print each logged iteration's first completions, rewards and advantages."}
    )
    num_completions_to_print: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Rows log_completions prints (None: 4)."}
    )
    num_iterations: Annotated[int, AT_LEAST_1] = field(
        default=PresetDefault(1), metadata={"help": "Inner iterations over each batch (loss_type='clipped')."}
    )
    epsilon: Annotated[float, ABOVE_0] = field(
        default=0.2, metadata={"help": "Clip range of the ratio (loss_type='clipped')."}
    )
    beta: Annotated[float, AT_LEAST_0] = field(
        default=PresetDefault(0.0),
        metadata={"help": "KL coefficient to the reference policy (0: no reference is kept)."},
    )
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator for beta: 'k1' or 'k3'."})
    update_schedule: str = field(
        default=PresetDefault("joint"),
        metadata={
            "help": (
                "'joint': one optimizer step per minibatch for all agents; 'per_agent_turn': one step per "
                "(agent, turn) group (MAGRPO)."
            )
        },
    )
    preset: str | None = field(
        default=None, metadata={"help": "'magrpo': MAGRPO's update rule (see docs/algorithm.md)."}
    )
    # ------------------------------------------------------------------ the iteration's shortcuts (trainers/plan.py)
    old_logprobs_from_update: bool = field(
        default=True,
        metadata={
            "help": (
                "Skip scoring's old log-prob forward when the update's first forward gives them (GRPO's loss types "
                "with one optimizer step per iteration; REINFORCE without a KL term reads none; see "
                "trl_collm/trainers/plan.py). False: a scoring forward."
            )
        },
    )

    def uses_reference(self) -> bool:
        return self.beta != 0

    def __post_init__(self):
        self._scale_advantages_set = not isinstance(self.scale_advantages, PresetDefault)
        if self.max_completion_length is not None:  # GRPO's name of response_length: one value under both names
            default = TeamConfig.__dataclass_fields__["response_length"].default
            if self.response_length not in (default, self.max_completion_length):
                raise ValueError(
                    f"`max_completion_length`={self.max_completion_length} and `response_length`="
                    f"{self.response_length} name the same length (GRPO's name and ours); set one of them."
                )
            self.response_length = self.max_completion_length
        if self.scale_rewards is not None:
            key = str(self.scale_rewards).lower()
            if key not in SCALE_REWARDS:
                raise ValueError(
                    f"`scale_rewards`={self.scale_rewards!r} is not valid; choose one of 'group', 'batch', 'none' "
                    "(true / false: group / none)."
                )
            self.scale_rewards = SCALE_REWARDS[key]
        super().__post_init__()

    def _validate(self):
        super()._validate()
        check_grpo_fields(self)
        if self.loss_type in OTHER_GRPO_LOSS_TYPES:
            raise ValueError(
                f"`loss_type`={self.loss_type!r} is GRPOConfig's and not here; the nearest is "
                f"loss_type={OTHER_GRPO_LOSS_TYPES[self.loss_type]!r} (choose one of {list(_MC_CHOICES['loss_type'])})."
            )
        self._check_choices(_MC_CHOICES)
        self._check_grpo_names()
        if self.num_generations < 2 and self.baseline != "none":
            raise ValueError(
                f"`num_generations`={self.num_generations}: a group baseline needs >= 2 samples; raise it or set "
                "baseline='none'."
            )
        if self.joint_mode == "cross" and self.num_turns > 1:
            raise ValueError(
                "`joint_mode='cross'` is single-turn; use joint_mode='aligned' with expansion='tree' for multi-turn."
            )
        if self.loss_type == "reinforce" and self.num_iterations > 1:  # a ratio loss (clipped, GRPO's) takes several
            raise ValueError(
                "`loss_type='reinforce'` is on-policy (no ratio); set `num_iterations=1` or use loss_type='clipped'."
            )

    def _check_grpo_names(self) -> None:
        """GRPOConfig's names that set our fields: scale_rewards, generation_batch_size / steps_per_generation, the
        GRPO-loss-only fields, trust_remote_code."""
        self.max_completion_length = self.response_length
        if self.scale_rewards is not None and self.scale_advantages and self._scale_advantages_set:
            raise ValueError(
                f"`scale_rewards`={self.scale_rewards!r} and `scale_advantages`=True both scale the advantages "
                "(GRPO's std and ours); set one of them."
            )
        grpo_only = {"epsilon_high": None, "delta": None, "use_bias_correction_kl": True}
        for name, default in grpo_only.items():
            if self.loss_type not in GRPO_LOSS_TYPES and getattr(self, name) != default:
                raise ValueError(
                    f"`{name}`={getattr(self, name)!r} applies to GRPO's loss types; set loss_type to one of "
                    f"{list(GRPO_LOSS_TYPES)} or leave it unset."
                )
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                "`generation_batch_size` and `steps_per_generation` both set the generation's size (as in GRPO); "
                "set one of them."
            )
        steps = self.steps_per_generation
        if self.generation_batch_size is not None:
            per_step = self.per_device_train_batch_size * self.num_generations * self.world_size
            if self.generation_batch_size % per_step:
                raise ValueError(
                    f"`generation_batch_size`={self.generation_batch_size} must be a multiple of "
                    f"per_device_train_batch_size x num_generations x processes = {per_step} (a micro-batch here "
                    "is per_device_train_batch_size prompts, num_generations completions each)."
                )
            steps = self.generation_batch_size // per_step
        if steps is not None:
            gas = self.gradient_accumulation_steps
            if steps % gas or self.num_mini_batches not in (1, steps // gas):
                raise ValueError(
                    f"{steps} micro-batches per generation (steps_per_generation / generation_batch_size) must be "
                    f"gradient_accumulation_steps ({gas}) x num_mini_batches ({self.num_mini_batches}); set "
                    "num_mini_batches or one of them."
                )
            self.num_mini_batches = steps // gas
        if self.trust_remote_code:
            self.model_init_kwargs = {**(self.model_init_kwargs or {}), "trust_remote_code": True}
        # GRPO's sampling settings: checked as the sampler takes them (generation_kwargs' JSON text parsed)
        self.generation_kwargs = dict(SamplingSettings.from_config(self).generation_kwargs) or None


check_presettable(MultiAgentMCConfig, MC_PRESETS)
