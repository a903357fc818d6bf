"""The agents: separate models (any architecture, own tokenizer) or named LoRA adapters on one shared frozen base.

`AgentTeam` owns the policies, their tokenizers and their reference policies, and knows how to
- encode observations (text or token ids) with each agent's tokenizer (left padding),
- compute per-token log-probs of given responses (policy and reference),
- save itself as one folder per agent.

It holds models, not generation state: sampling is `trl_collm.generation.sampler.Sampler`'s (a team, a backend, the
settings).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from .modeling import flatten_adapter_folder, input_pad_id, left_pad, truncate_left

Observation = str | list[int]


def _set_adapter_keep_grads(model, name: str, trainable: list[str]) -> None:
    """Activate one adapter without freezing the others (PEFT's set_adapter flips requires_grad)."""
    model.set_adapter(name)
    model.set_requires_grad(trainable, requires_grad=True)


def adapter_parameters(peft_model: nn.Module, name: str) -> list[nn.Parameter]:
    """The parameters of one named adapter, found through PEFT's tuner layers (not by matching parameter names)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    params = []
    for module in peft_model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            layer = getattr(module, layer_name, None)
            if layer is not None and name in layer:
                part = layer[name]
                params += list(part.parameters()) if isinstance(part, nn.Module) else [part]
    return params


class AgentTeam(nn.Module):
    """n agents. Either `policies` (name -> model, separate layout) or `shared_base` (a PeftModel whose adapters are
    named after the agents) must be given. `description`: the team.json it was loaded from (`load_team`).
    """

    def __init__(
        self,
        names: list[str],
        tokenizers: dict,
        policies: dict[str, nn.Module] | None = None,
        shared_base: nn.Module | None = None,
        ref_policies: dict[str, nn.Module | None] | None = None,
        share_prefix: bool = True,
        description: dict | None = None,
    ):
        super().__init__()
        if (policies is None) == (shared_base is None):
            raise ValueError(
                "AgentTeam needs exactly one of `policies` (separate models) or `shared_base` (LoRA adapters)."
            )
        self.names = list(names)
        self.tokenizers = dict(tokenizers)
        self.layout = "shared_base" if shared_base is not None else "separate"
        if policies is not None:
            self.policies = nn.ModuleDict({n: policies[n] for n in self.names})
        else:
            self.shared_base = shared_base
            self.extra_adapters: list[str] = []  # critic adapters registered later by the critic
            # PEFT's add_adapter leaves only the active adapter trainable; every agent's adapter must be, or the
            # optimizer (built from requires_grad parameters) would never update agents 2..n.
            _set_adapter_keep_grads(shared_base, self.names[0], self.trainable_adapters())
        # Reference policies are frozen and kept outside the module tree, so optimizers and DeepSpeed never see them.
        self._refs = dict(ref_policies or {})
        self._pad_ids: dict[str, int] = {}
        # Compute the rows' common prompt prefix once in the team's forwards and its critics' (team/prefix.py).
        self.share_prefix = share_prefix
        # The team.json a saved team was loaded from (load_team), None for a team built in memory: `play` reads the
        # sampling and prompt settings it records, so a loaded team is played as it was trained.
        self.description = description

    # ------------------------------------------------------------------ access
    def model_of(self, name: str) -> nn.Module:
        return self.shared_base if self.layout == "shared_base" else self.policies[name]

    def trainable_adapters(self) -> list[str]:
        return list(self.names) + list(getattr(self, "extra_adapters", []))

    @contextlib.contextmanager
    def active(self, name: str):
        """Yields the module that computes agent `name` (for a shared base: the base with that adapter on)."""
        if self.layout == "separate":
            yield self.policies[name]
            return
        base = self.shared_base
        previous = base.active_adapter
        _set_adapter_keep_grads(base, name, self.trainable_adapters())
        try:
            yield base
        finally:
            _set_adapter_keep_grads(base, previous, self.trainable_adapters())

    def agent_parameters(self, name: str) -> list[nn.Parameter]:
        if self.layout == "separate":
            return [p for p in self.policies[name].parameters() if p.requires_grad]
        return adapter_parameters(self.shared_base, name)

    def add_adapter(self, name: str, peft_config) -> None:
        """One more trainable adapter on the shared base (a critic's), next to the agents'."""
        self.shared_base.add_adapter(name, peft_config)
        self.extra_adapters.append(name)
        # add_adapter creates the new adapter frozen; make it (and keep the agents') trainable.
        _set_adapter_keep_grads(self.shared_base, self.shared_base.active_adapter, self.trainable_adapters())

    def has_reference(self, name: str) -> bool:
        if self.layout == "shared_base":
            return True
        return self._refs.get(name) is not None or _is_peft(self.policies[name])

    # ------------------------------------------------------------------ tokens
    def encode(self, name: str, observations: list[Observation], device, max_length: int | None = None):
        """Left-padded (ids, mask) for one agent. Observations may be text or token-id lists; a prompt longer than
        `max_length` tokens keeps its last ones (the sampler passes its PromptSettings' limit)."""
        tok = self.tokenizers[name]
        rows = []
        for obs in observations:
            if isinstance(obs, str):
                ids = tok(obs, add_special_tokens=False)["input_ids"]
            else:
                ids = list(obs)
            rows.append(truncate_left(ids, max_length, f"agent {name!r} prompt"))
        return left_pad(rows, self.pad_id(name), device)

    def pad_id(self, name: str) -> int:
        """The id that fills agent `name`'s padded positions (see `input_pad_id`)."""
        if name not in self._pad_ids:
            self._pad_ids[name] = input_pad_id(self.tokenizers[name], self.model_of(name))
        return self._pad_ids[name]

    def decode_observation(self, name: str, obs: Observation) -> str:
        if isinstance(obs, str):
            return obs
        return self.tokenizers[name].decode(obs, skip_special_tokens=True)

    # ------------------------------------------------------------------ log-probs
    def logprobs(
        self,
        name: str,
        query_ids,
        query_mask,
        response_ids,
        response_mask,
        temperature: float = 1.0,
        with_entropy: bool = False,
        reference: bool = False,
        prompt_cache=None,
    ):
        """Per-token log-probs (B, Lr) of `response_ids` under agent `name` (or its reference policy), and with
        `with_entropy` the per-token entropy (B, Lr), without gradient (it is logged, not trained on).
        `prompt_cache`: these rows' prompt prefill, kept with its graph from sampling (team/prompt_cache.py); only
        the response is then forwarded (the prompt's keys and values, and their gradients, come from it)."""
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax

        from .prefix import forward_last
        from .prompt_cache import response_logits

        lr = response_ids.shape[1]
        with self._reference_ctx(name) if reference else self.active(name) as model:
            model = self._refs[name] if reference and self._refs.get(name) is not None else model
            if prompt_cache is not None:
                logits = response_logits(model, prompt_cache, response_ids, response_mask)
            else:
                ids = torch.cat([query_ids, response_ids], dim=1)
                mask = torch.cat([query_mask.long(), response_mask.long()], dim=1)
                logits = forward_last(model, ids, mask, lr + 1, causal_lm=True, enabled=self.share_prefix)[:, :-1]
        logits = logits.float()
        if temperature != 1.0:  # dividing by 1 changes no bit but copies the (B, Lr, vocab) logits
            logits = logits / temperature
        logp = selective_log_softmax(logits, response_ids)  # gather minus logsumexp: no (B, Lr, vocab) log-softmax
        logp = logp.masked_fill(~response_mask.bool(), 0.0)
        if not with_entropy:
            return logp, None
        # The entropy is logged, never differentiated: with grad on, autograd would keep its full-vocabulary softmax
        # and log-softmax (2x the logits: 192 MiB for 8 x 64 tokens of a 49k vocabulary) until the loss is built.
        with torch.no_grad():
            return logp, entropy_from_logits(logits)

    @contextlib.contextmanager
    def _reference_ctx(self, name):
        if self._refs.get(name) is not None:
            yield self._refs[name]
            return
        model = self.model_of(name)
        if not _is_peft(model):
            raise ValueError(f"Agent {name!r} has no reference policy; pass `ref_model` or set `kl_coef=0`.")
        with self.active(name) as m, m.disable_adapter():
            yield m

    # ------------------------------------------------------------------ saving
    def save_agent(self, name: str, path: str, safe_serialization: bool = True, state_dict=None) -> None:
        model = self.model_of(name)
        if self.layout == "shared_base":
            model.save_pretrained(path, selected_adapters=[name], safe_serialization=safe_serialization)
            flatten_adapter_folder(path, name)
        else:
            model.save_pretrained(path, safe_serialization=safe_serialization, state_dict=state_dict)
        self.tokenizers[name].save_pretrained(path)


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PeftModel)


def freeze_copy(model: nn.Module) -> nn.Module:
    """A frozen, eval-mode deep copy used as a reference policy."""
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref
