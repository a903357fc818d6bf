"""Critic layouts: which critics a run has, what each reads and which agents each values.

A layout owns its inputs, as EPyMARL's critics build their own: its unit keys, its number of outputs, and its
*views* (`batches`: the text each unit reads for each turn). CC and DC differ only here:

- `CentralizedCritic` (CoLLM-CC): one unit over the joint view of all agents;
- `DecentralizedCritic` (CoLLM-DC): one unit per agent over that agent's own context.

`CRITIC_TYPES` maps `critic_type` to a layout; a new critic type is one subclass plus one `register_critic_type`
call (see docs/architecture.md). Where a unit's parameters live is the unit's business (`units.py`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..team.assembly import per_agent
from ..team.modeling import max_positions
from .units import PLACEMENTS, CriticUnit, UnitSpec
from .views import centralized_view, decentralized_view, fair_share

if TYPE_CHECKING:
    from ..rollout import AgentTurn, Rollout
    from ..team.agents import AgentTeam


@dataclass
class CriticBatch:
    """One unit's inputs for the rows of one turn (the trainer keeps its targets: PPO's `ValueTargets`).

    Column c of the unit's values holds the value of the agents in `columns[c]` (one agent, or a group that shares
    one team value); its target is the mean of their returns.
    """

    key: str  # critic unit
    turn: int
    columns: list[list[str]]  # the agents each output column values
    episode_ids: torch.Tensor  # (B,)
    views: list[str]
    suffix_ids: list[list[int]] | None  # token-level: the agent's response tokens appended to the view
    output: int = 0  # token-level: which output of the unit's head values the agent
    view_ids: list[list[int]] | None = None  # the views tokenized by the critic (filled on first use)

    @property
    def agents(self) -> list[str]:
        """The agents this batch values, in column order."""
        return [a for group in self.columns for a in group]

    def scatter_values(self, values: torch.Tensor, table: torch.Tensor, names: list[str]) -> None:
        """Write turn-level values (B, k) into the (E, T, n) value table."""
        for c, group in enumerate(self.columns):
            for a in group:
                table[self.episode_ids, self.turn, names.index(a)] = values[:, c]

    def column_targets(self, returns: torch.Tensor, names: list[str]) -> torch.Tensor:
        """(B, k) targets from the (E, T, n) returns: each column's agents' mean return."""
        rows = returns[self.episode_ids, self.turn]
        cols = []
        for group in self.columns:
            idx = [names.index(a) for a in group]
            cols.append(rows[:, idx[0]] if len(idx) == 1 else rows[:, idx].mean(-1))
        return torch.stack(cols, dim=-1)


class TeamCritic(nn.Module):
    """All critic units of a run, keyed by unit key, and the layout that says what each reads."""

    name = ""  # the `critic_type` this layout registers under
    # How model cards and plot titles name the layout: each layout class says it for itself, so team/card.py and
    # cli/plotting.py keep no table of critic names. Read from the class's own namespace: a registered subclass that
    # sets neither is described by its name and docstring, never with its parent's words.
    title = ""  # short, for plot titles: "CoLLM-CC, centralized critic"
    summary = ""  # one sentence, for the model card

    @classmethod
    def describe_layout(cls) -> tuple[str, str]:
        """(title, summary) of this layout, for plots and model cards."""
        own = vars(cls)
        doc = " ".join((cls.__doc__ or "").split(".")[0].split())
        title = own.get("title") or f"{cls.name} critic"
        summary = own.get("summary") or f"PPO-style actors with the {cls.name!r} critic type" + (
            f": {doc}" if doc else ""
        )
        return title, summary

    def __init__(self, agent_names: list[str], args, token_level: bool):
        super().__init__()
        self.agent_names = list(agent_names)
        self.value_mode = args.centralized_value
        self.token_level = token_level
        self.units = nn.ModuleDict()

    # ------------------------------------------------------------------ what a layout says
    @classmethod
    def check_config(cls, args) -> None:
        """Reject options this layout cannot serve (called by the config, with messages naming the fix)."""

    def unit_keys(self) -> list[str]:
        raise NotImplementedError

    def num_outputs(self) -> int:
        return 1

    def owner(self, key: str, args) -> str:
        """The agent whose tokenizer (and, for an actor head, backbone) unit `key` uses."""
        return key

    def per_unit(self, value, arg: str, replicate: bool) -> dict:
        """A per-critic argument (`value_model`, `critic_processing_class`) as {unit key: value}; `replicate`: one
        object may serve every unit (a tokenizer), else one per unit is needed (a model)."""
        return per_agent(value, self.agent_names, arg, replicate=replicate)

    def adapter_name(self, key: str) -> str:
        return f"critic_{key}"

    def folder(self, key: str) -> str:
        """Where unit `key` is saved, relative to the output folder."""
        return "critic" if len(self.agent_names) == 1 else os.path.join("critic", key)

    def key_for(self, agent: str) -> str:
        """The unit that values `agent`."""
        return agent

    def batches(self, roll: Rollout) -> list[CriticBatch]:
        """The views: which text each unit reads, per turn, and which agents its outputs value."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def values(self, cb: CriticBatch, device, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Values (B, k) at the end of the view (turn-level) or (B, Lr) per response token (token-level)."""
        unit = self.units[cb.key]
        if cb.view_ids is None:  # tokenized once per iteration: the scoring pass and every update step reuse it
            cb.view_ids = unit.tokenize(cb.views)
        sel = range(len(cb.views)) if rows is None else rows.tolist()
        suffix = [cb.suffix_ids[i] for i in sel] if cb.suffix_ids is not None else None
        ids, mask = unit.pad([cb.view_ids[i] for i in sel], device, suffix_ids=suffix)
        if suffix is None:
            return unit(ids, mask, keep=1)[:, -1, :]
        lr = max(len(s) for s in suffix)
        # Left padding puts every suffix at the right end; value of the state before token j sits at L - lr - 1 + j.
        return unit(ids, mask, keep=lr + 1)[:, :-1, cb.output]

    def loss_columns(self, cbs: list[CriticBatch], agents: list[str]):
        """Yields (batch, columns) for the critic losses of a step that updates `agents`."""
        keys = {self.key_for(a) for a in agents}
        for cb in cbs:
            cols = [c for c, group in enumerate(cb.columns) if any(a in agents for a in group)]
            if cb.key in keys and cols:
                yield cb, cols

    def unit_parameters(self) -> dict[str, list[nn.Parameter]]:
        return {k: u.own_parameters() for k, u in self.units.items()}

    def parameters_for(self, agents: list[str]) -> list[list[nn.Parameter]]:
        """The trainable parameters of the units that value `agents`, one list per unit."""
        units = self.unit_parameters()
        return [units[k] for k in sorted({self.key_for(a) for a in agents})]

    def shares_actor_weights(self) -> bool:
        """Whether a critic step can move an actor's weights (a head on an actor's backbone)."""
        return any(u.shares_actor_weights for u in self.units.values())

    def set_context_limits(self, reserved_tokens: int) -> None:
        """Views longer than a body's context would crash or wrap positions: cut them to fit (keeping the end)."""
        for unit in self.units.values():
            context = max_positions(unit.context_model())
            if context is not None:
                unit.max_tokens = max(1, context - reserved_tokens)

    def check_tokenizers(self, team: AgentTeam) -> None:
        """Token-level values read the agent's response tokens: the unit must share the agent's vocabulary."""
        for a in team.names:
            if self.units[self.key_for(a)].tokenizer.get_vocab() != team.tokenizers[a].get_vocab():
                raise ValueError(
                    f"`advantage_level='token'` needs the critic to read agent {a!r}'s tokens, but their tokenizers "
                    "differ; use advantage_level='turn' for heterogeneous teams."
                )

    def card_facts(self) -> dict:
        """The critic's settings as the model card lists them (named like the config fields)."""
        return {"critic_type": self.name}

    def describe(self) -> dict:
        """The critic's entry in team.json."""
        return {
            "type": self.name,
            "value_mode": self.value_mode,
            "units": {k: dict(u.describe(), folder=self.folder(k)) for k, u in self.units.items()},
        }

    def save(self, output_dir: str, part) -> None:
        """Every unit into its folder; `part(prefix)` is the gathered state dict under `prefix` (ZeRO-3) or None."""
        for key, unit in self.units.items():
            folder = os.path.join(output_dir, self.folder(key))
            os.makedirs(folder, exist_ok=True)
            own = f"critic.units.{key}."
            unit.save(folder, lambda prefix, absolute=False, own=own: part(prefix if absolute else own + prefix))
            unit.tokenizer.save_pretrained(folder)


def _suffix(at: AgentTurn) -> list[list[int]]:
    # Whole padded rows: every suffix has the same length, so response token j sits at the same position in each row.
    return [r.tolist() for r in at.gen.response_ids]


class DecentralizedCritic(TeamCritic):
    """CoLLM-DC: one unit per agent; agent i's unit reads only agent i's own context (`decentralized_view`)."""

    name = "decentralized"
    title = "CoLLM-DC, decentralized critics"
    summary = "CoLLM-DC: PPO-style actors with one decentralized critic per agent (its own history only)"
    ignores = ("centralized_value",)  # each agent's critic values that agent's own return: no team / tagged value

    def __init__(self, agent_names: list[str], args, token_level: bool):
        super().__init__(agent_names, args, token_level)
        self.value_mode = "own"  # what team.json and the card say: not the centralized_value the config holds

    @classmethod
    def check_config(cls, args) -> None:
        if args.centralized_value != "per_agent_heads":  # the field's default: a DC config never needs to set it
            raise ValueError(
                f"`centralized_value`={args.centralized_value!r} applies to critic_type='centralized' only (a "
                "decentralized critic values each agent's own return); drop centralized_value, or use "
                "critic_type='centralized'."
            )

    def unit_keys(self) -> list[str]:
        return list(self.agent_names)

    def views(self, roll: Rollout, t: int, agent: str) -> list[str]:
        """What `agent`'s unit reads at turn t, one text per episode played at t (in `episode_ids` order)."""
        return [decentralized_view(c) for c in roll.turns[t][agent].contexts]

    def batches(self, roll: Rollout) -> list[CriticBatch]:
        out = []
        for t, turn in enumerate(roll.turns):
            ids = turn[self.agent_names[0]].episode_ids
            for a in self.agent_names:
                views = self.views(roll, t, a)
                out.append(CriticBatch(a, t, [[a]], ids, views, _suffix(turn[a]) if self.token_level else None))
        return out


class CentralizedCritic(TeamCritic):
    """CoLLM-CC: one unit over the joint view: every agent's context tagged by name (`centralized_view`), optionally
    the joint action. Its outputs (`centralized_value`): one team value, one head per agent, or one head with the
    view tagged by the agent it values."""

    name = "centralized"
    title = "CoLLM-CC, centralized critic"
    summary = "CoLLM-CC: PPO-style actors with one centralized critic that reads every agent's history"
    _KEY = "central"  # the one unit's key (and its name in team.json)

    def __init__(self, agent_names: list[str], args, token_level: bool):
        super().__init__(agent_names, args, token_level)
        self.sees_joint_action = args.critic_sees_joint_action

    def card_facts(self) -> dict:
        return dict(super().card_facts(), centralized_value=self.value_mode)

    @classmethod
    def check_config(cls, args) -> None:
        if args.centralized_value != "team":
            return
        if args.advantage_level == "token":
            raise ValueError(
                "`advantage_level='token'` needs a value per agent token; set `centralized_value='per_agent_heads'` "
                "or 'agent_tagged'."
            )
        if args.reward_type == "per_agent":
            raise ValueError(
                "`reward_type='per_agent'` with one team value cannot credit agents separately; set "
                "`centralized_value='per_agent_heads'`."
            )

    def unit_keys(self) -> list[str]:
        return [self._KEY]

    def num_outputs(self) -> int:
        return len(self.agent_names) if self.value_mode == "per_agent_heads" else 1

    def owner(self, key: str, args) -> str:
        return args.critic_backbone_agent or self.agent_names[0]

    def per_unit(self, value, arg: str, replicate: bool) -> dict:
        if not replicate:
            if isinstance(value, (list, tuple)) and len(value) != 1:
                raise ValueError(
                    f"A centralized critic is one model but `{arg}` lists {len(value)}; pass one value model."
                )
            if isinstance(value, dict):
                raise ValueError(f"A centralized critic is one model; pass one `{arg}`, not a dict.")
            return {self._KEY: value[0] if isinstance(value, (list, tuple)) else value}
        return {self._KEY: value}

    def adapter_name(self, key: str) -> str:
        return "critic"

    def folder(self, key: str) -> str:
        return "critic"

    def key_for(self, agent: str) -> str:
        return self._KEY

    def batches(self, roll: Rollout) -> list[CriticBatch]:
        names, token = self.agent_names, self.token_level
        out = []
        for t, turn in enumerate(roll.turns):
            ids = turn[names[0]].episode_ids
            actions = None
            if self.sees_joint_action:
                actions = [[turn[a].gen.texts[k] for a in names] for k in range(len(ids))]
            joint = [
                self._fit([turn[a].contexts[k] for a in names], actions[k] if actions else None)
                for k in range(len(ids))
            ]

            def view(k, target=None):
                return centralized_view(names, joint[k], actions[k] if actions else None, target)

            if self.value_mode == "agent_tagged" or token:
                for i, a in enumerate(names):
                    tag = a if self.value_mode == "agent_tagged" else None
                    output = i if self.value_mode == "per_agent_heads" else 0
                    views = [view(k, tag) for k in range(len(ids))]
                    suffix = _suffix(turn[a]) if token else None
                    out.append(CriticBatch(self._KEY, t, [[a]], ids, views, suffix, output))
            else:
                cols = [[a] for a in names] if self.value_mode == "per_agent_heads" else [list(names)]
                out.append(CriticBatch(self._KEY, t, cols, ids, [view(k) for k in range(len(ids))], None))
        return out

    def _fit(self, contexts: list[str], actions: list[str] | None) -> list[str]:
        """The agents' contexts cut to the critic's context, each from its left, with the room shared fairly
        (`fair_share`): cutting the joined view from the left would drop the first agents' contexts whole."""
        unit = self.units[self._KEY]
        if unit.max_tokens is None:
            return contexts
        names = self.agent_names
        target = max(names, key=len) if self.value_mode == "agent_tagged" else None
        count = unit.tokenizer(centralized_view(names, contexts, actions, target), add_special_tokens=False)
        if len(count["input_ids"]) <= unit.max_tokens:
            return contexts
        frame = unit.tokenizer(centralized_view(names, [""] * len(names), actions, target), add_special_tokens=False)
        # a few tokens per seam for merges that re-tokenizing the cut text may undo; truncate_left stays the backstop
        budget = unit.max_tokens - len(frame["input_ids"]) - 4 * len(names)
        ids = unit.tokenizer(list(contexts), add_special_tokens=False)["input_ids"]
        keep = fair_share([len(row) for row in ids], budget)
        warnings.warn(
            f"critic view has {len(count['input_ids'])} tokens, more than the critic's {unit.max_tokens}; keeping the "
            f"last {keep} tokens of the agents' contexts {list(names)}.",
            stacklevel=3,
        )
        return [unit.tokenizer.decode(row[len(row) - n :]) if n else "" for row, n in zip(ids, keep)]


# critic_type -> layout. A new critic type is one TeamCritic subclass plus one register_critic_type call.
CRITIC_TYPES: dict[str, type[TeamCritic]] = {}


def register_critic_type(cls: type[TeamCritic]) -> type[TeamCritic]:
    """Make `critic_type=cls.name` choose `cls` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`; set the `critic_type` it registers under.")
    CRITIC_TYPES[cls.name] = cls
    return cls


register_critic_type(CentralizedCritic)
register_critic_type(DecentralizedCritic)


def ignored_critic_fields(critic_type: str) -> tuple[str, ...]:
    """The config fields the layout `critic_type` never reads: a preset leaves them at their defaults."""
    return getattr(CRITIC_TYPES.get(critic_type), "ignores", ())


def check_critic_config(args) -> None:
    """`critic_type` and `critic_placement` name registered classes, and the layout accepts the other options
    (called from the PPO config's validation)."""
    for name, allowed, value in (
        ("critic_type", CRITIC_TYPES, args.critic_type),
        ("critic_placement", PLACEMENTS, args.critic_placement),
    ):
        if value not in allowed and not (name == "critic_placement" and value is None):  # None: chosen from the team
            raise ValueError(f"`{name}`={value!r} is not valid; choose one of {list(allowed)}.")
    CRITIC_TYPES[args.critic_type].check_config(args)


def critic_outputs(args, num_agents: int) -> int:
    """How many outputs the critic's value model needs for this config and team size (its `num_labels`, when you
    build the value model yourself)."""
    names = [f"agent_{i}" for i in range(num_agents)]
    return CRITIC_TYPES[args.critic_type](names, args, token_level=False).num_outputs()


def build_critic(
    team: AgentTeam, value_model, args, peft_config, critic_processing_class=None, token_level: bool = False
) -> TeamCritic:
    """The critic of a run: the layout `critic_type` names, with one unit per key where `critic_placement` says."""
    names = team.names
    # A given value model decides the placement (TRL's PPO script passes one even with PEFT); else a LoRA team's
    # critic is one more adapter on the shared base.
    default = "shared_base_adapter" if team.layout == "shared_base" and value_model is None else "separate"
    placement = args.critic_placement or default
    if args.critic_backbone_agent is not None and args.critic_backbone_agent not in names:
        raise ValueError(f"`critic_backbone_agent`={args.critic_backbone_agent!r} is not one of the agents {names}.")
    if value_model is not None and placement != "separate":
        raise ValueError(
            f"`value_model` was given but `critic_placement`={placement!r}; set critic_placement='separate' or drop "
            "value_model."
        )
    critic = CRITIC_TYPES[args.critic_type](names, args, token_level)
    value_models = critic.per_unit(value_model, "value_model", replicate=False)
    tokenizers = critic.per_unit(critic_processing_class, "critic_processing_class", replicate=True)
    settings = f"critic_type={args.critic_type!r}, centralized_value={args.centralized_value!r}"
    unit_cls: type[CriticUnit] = PLACEMENTS[placement]
    for key in critic.unit_keys():
        spec = UnitSpec(
            team,
            key,
            critic.owner(key, args),
            critic.num_outputs(),
            value_models[key],
            tokenizers[key],
            critic.adapter_name(key),
            peft_config,
            args.model_init_kwargs,
            settings,
        )
        critic.units[key] = unit_cls.build(spec)
    return critic
