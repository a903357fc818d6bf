"""`MultiAgentMCConfig`: the configuration of `MultiAgentMCTrainer`, the Monte-Carlo (critic-free) team baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .presets import PresetDefault, check_presettable
from .ranges import ABOVE_0, AT_LEAST_0, AT_LEAST_1
from .team_config import TeamConfig

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
class MultiAgentMCConfig(TeamConfig):
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
        loss_type (`str`, *optional*, defaults to `'reinforce'`):
            'reinforce' (on-policy, -(sum of log-probs) * A, no ratio/clip) or 'clipped' (ratio surrogate over
            num_iterations).
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

    def uses_reference(self) -> bool:
        return self.beta != 0

    def _validate(self):
        super()._validate()
        self._check_choices(_MC_CHOICES)
        if self.num_generations < 2 and self.baseline != "none":
            raise ValueError(
                f"`num_generations`={self.num_generations}: a group baseline needs >= 2 samples; raise it or set "
                "baseline='none'."
            )
        if self.joint_mode == "cross" and self.num_turns > 1:
            raise ValueError(
                "`joint_mode='cross'` is single-turn; use joint_mode='aligned' with expansion='tree' for multi-turn."
            )
        if self.loss_type == "reinforce" and self.num_iterations > 1:
            raise ValueError(
                "`loss_type='reinforce'` is on-policy (no ratio); set `num_iterations=1` or use loss_type='clipped'."
            )


check_presettable(MultiAgentMCConfig, MC_PRESETS)
