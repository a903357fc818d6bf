"""Shared trainer base: builds the team, the critic and the environment, owns the accelerator, optimizer, logging,
checkpoints, saving and the Hub push. The PPO and MC trainers only say how advantages and losses are made. The loop
and transformers' callback contract are `TrainingLoop` (trainers/loop.py); the optimizer and the update schedule
`TeamUpdates` (trainers/updates.py); both are mixed in here.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from transformers import set_seed
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model

from ..cpu import adapt_for_cpu
from ..envs.reward_functions import build_env
from ..generation.backends import make_backend
from ..generation.prompts import PromptSettings
from ..generation.sampler import Sampler, SamplingSettings
from ..numerics import NonFiniteSteps
from ..quiet import library_quiet
from ..rollout import Rollout, run_episodes
from ..team import saved
from ..team.assembly import TeamModel, build_team, resolve_agent_names
from . import distributed, evaluation, hub
from .batches import rollout_loader, set_batch_sizes
from .console import PhaseClock, TimedSampler
from .loop import TrainingLoop
from .output_dir import check_writable
from .progress import install_console, threads_and_quiet
from .updates import TeamUpdates


class TeamTrainerBase(TrainingLoop, TeamUpdates, _BaseTrainer):
    _tag_names = ["trl", "trl-collm", "multi-agent"]
    _name = "TeamTrainer"

    def __init__(
        self,
        args,
        processing_class=None,
        model=None,
        ref_model=None,
        reward_model=None,
        train_dataset=None,
        value_model=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        reward_funcs=None,
        env=None,
        critic_processing_class=None,
        prompt_formatters=None,
    ):
        if model is None:
            raise ValueError("`model` is required: a model, a path, a list, or a dict name -> model.")
        if train_dataset is None or len(train_dataset) == 0:
            raise ValueError("`train_dataset` is empty; pass a dataset with at least one row per rollout batch.")
        # Seed before building anything: fresh heads (value heads, a new `score` layer) must initialise the same way
        # in every run, or a resumed or repeated run cannot match (transformers.Trainer seeds only later).
        set_seed(args.seed)
        threads_and_quiet(args)  # torch's threads as the CLI picks them; no DeepSpeed accelerator line (progress.py)
        names = resolve_agent_names(model, args)
        if args.should_save:  # a folder no save can write to fails here, not at the first save hours later
            check_writable(args.output_dir)
        args.resolve_for_team(len(names))
        distributed.prepare_args_for_deepspeed(args)  # before the accelerator exists (CPU backend, use_cpu, clipping)
        with library_quiet():  # transformers' weight-loading bars, its and PEFT's FutureWarnings (trl_collm/quiet.py)
            team = build_team(model, processing_class, ref_model, peft_config, args, names)
            # What the team is built from, before DeepSpeed can partition it (team.json; a resume compares it)
            self.base_identity = saved.base_identity(team)
            critic = self.build_critic(team, value_model, args, peft_config, critic_processing_class)
        self.env = build_env(env, reward_funcs, reward_model, prompt_formatters, args, team)
        self.reward_model = reward_model
        team_model = TeamModel(team, critic)
        for module in [team_model] + [r for r in team._refs.values() if r is not None]:
            disable_dropout_in_model(module)
        if args.activation_checkpointing:
            kwargs = args.activation_checkpointing_kwargs or {"use_reentrant": False}
            for a in names:
                team.model_of(a).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        super().__init__(
            model=team_model,
            args=args,
            data_collator=data_collator or (lambda rows: rows),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=team.tokenizers[names[0]],
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.team, self.critic = team, critic
        if self.accelerator.device.type == "cpu":  # the CPU adaptations, switched on in one place (trl_collm/cpu/)
            for module in (team, critic, *(r for r in team._refs.values() if r is not None)):
                if isinstance(module, torch.nn.Module):
                    adapt_for_cpu(module)
        install_console(self)  # one line of a few numbers per log, a progress bar with its ETA (progress.py)
        self.phase_clock = PhaseClock()
        self.sampler = self.build_sampler()
        self._last_loaded_step = None  # the global_step whose weights the backend has seen (TRL's pattern)
        for ref in team._refs.values():
            if ref is not None:
                ref.to(self.accelerator.device)
        if reward_model is not None:
            reward_model.to(self.accelerator.device).eval()
        self._metrics_history: list[dict] = []
        # What the team was trained for, recorded in team.json under "task" so `trl-collm eval` / `play` default to
        # it and refuse another task: {"name", "ref" (registry name or import path), "options", "dataset_source"}.
        # The CLI sets it (cli.task_record); Python users may too.
        self.task_record: dict | None = None
        self.nonfinite_steps = NonFiniteSteps(args.max_nonfinite_steps)

    def build_critic(self, team, value_model, args, peft_config, critic_processing_class):
        """The run's critic (`trl_collm.critics.TeamCritic`), or None for a critic-free trainer."""
        return None

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        distributed.keep_deepspeed_unimported(self.accelerator)  # deepspeed is imported only by a DeepSpeed run

    def _send_telemetry(self):
        # TRL's usage ping is for TRL's own trainers; a plugin should not report on their behalf.
        return

    # ------------------------------------------------------------------ batches (trainers/batches.py)
    def _batch_sizes(self):
        set_batch_sizes(self.args, self.accelerator.num_processes, len(self.train_dataset))

    def _rollout_loader(self):
        loader = rollout_loader(self.train_dataset, self.args)
        return self.accelerator.prepare(loader) if self.accelerator.num_processes > 1 else loader

    # ------------------------------------------------------------------ generation
    def build_sampler(self) -> Sampler:
        """The run's sampler: the team, the backend the arguments ask for (trl_collm/generation/sampler.py), the
        config's sampling and prompt settings (both saved in team.json), and the DeepSpeed gathering and lockstep for
        generation; its calls are timed on the phase clock (trainers/console.py)."""
        return TimedSampler(
            self.team,
            make_backend(self.args),
            SamplingSettings.from_config(self.args),
            self.accelerator.device,
            unwrap=self._unwrap_for_generation(),
            logprob_temperature=self.sampler_logprob_temperature(),
            lockstep=lambda: distributed.generation_in_lockstep(self),
            prompts=PromptSettings.from_config(self.args, self.team),
            clock=self.phase_clock,
        )

    def run_updates(self, scored, pairs, epochs: int, per_agent: bool) -> dict:
        with self.phase_clock.phase("update"):  # the iteration's "update" time (trainers/console.py)
            return super().run_updates(scored, pairs, epochs, per_agent)

    def sampler_logprob_temperature(self) -> float | None:
        """The temperature at which the sampler records the sampled tokens' log-probs (None: not needed)."""
        return None

    def _unwrap_for_generation(self):
        """A context-manager factory (module -> module) for generation under DeepSpeed, or None without it."""
        if not self.is_deepspeed_enabled:
            return None
        return lambda module: distributed.generation_context(self, module)

    def sampler_for_step(self, greedy: bool = False) -> Sampler:
        """The sampler, told first when the weights moved since it last generated. `global_step` moves once per
        iteration, after all of the iteration's optimizer steps (plain or DeepSpeed), so checking it here, before
        every generation, is the one spot that covers both (TRL's `_last_loaded_step`)."""
        if self._last_loaded_step != self.state.global_step:
            self.sampler.backend.weights_changed()
            self._last_loaded_step = self.state.global_step
        if not greedy:
            return self.sampler
        return self.sampler.with_settings(dataclasses.replace(self.sampler.settings, greedy=True))

    def rollout(self, rows: list[dict], greedy: bool = False, keep_prompt_graph: bool = False) -> Rollout:
        """Episodes for `rows`; `keep_prompt_graph`: every generation keeps its prompt prefill with gradients for
        the update (`prompt_cache_rows`), where the caller's plan allows it (trainers/plan.py)."""
        args = self.args
        self.model.eval()
        sampler = self.sampler_for_step(greedy)
        if keep_prompt_graph:
            sampler = dataclasses.replace(sampler, keep_prompt_graph=True)
        try:
            return run_episodes(
                sampler,
                self.env,
                rows,
                args.num_turns,
                early_termination_threshold=args.early_termination_threshold,
            )
        except RuntimeError as e:
            if "probability tensor contains" not in str(e):
                raise
            # torch.multinomial's words for NaN/inf logits: the weights are finite (the step guard saw to that)
            # but so large that a forward overflows.
            raise FloatingPointError(
                "an agent's next-token probabilities are NaN/inf while sampling: its weights have diverged "
                f"({self.nonfinite_steps.in_a_row} update(s) in a row were already skipped as non-finite). Lower the "
                "learning rate (or raise max_grad_norm clipping) and resume from the last checkpoint."
            ) from e

    # ------------------------------------------------------------------ scoring helpers (shared by the trainers)
    def loss_temperature(self) -> float:
        """The temperature the loss's log-probs divide the logits by: the sampling temperature, or 1 when
        `scale_logits_by_temperature` is off."""
        return self.args.temperature if self.args.scale_logits_by_temperature else 1.0

    def chunked_logprobs(self, a: str, g, reference: bool = False) -> torch.Tensor:
        """Agent `a`'s (or its reference's) log-probs of the generation `g`'s response tokens, (B, Lr), without
        gradients' memory: in chunks of local_rollout_forward_batch_size rows."""
        return _chunked(
            lambda s: self.team.logprobs(
                a,
                g.query_ids[s],
                g.query_mask[s],
                g.response_ids[s],
                g.response_mask[s],
                self.loss_temperature(),
                reference=reference,
            )[0],
            len(g.query_ids),
            self.args.local_rollout_forward_batch_size,
        )

    def _episode_metrics(self, agent_scores: torch.Tensor, turns_played: float, turns, length_turns=None) -> dict:
        """What every trainer logs about a batch's episodes: the turns played, the EOS count over `turns`
        (`turns[t][agent]` with a `.gen`), each agent's score (`agent_scores`, (E, n)) and mean response length
        (over `length_turns`, default all turns), and the env's reward components."""
        names = self.team.names
        length_turns = turns if length_turns is None else length_turns
        eos = sum(float(turn[a].gen.ended.float().sum()) for turn in turns for a in names)
        metrics = {"objective/turns": turns_played, "val/num_eos_tokens": float(eos)}
        for i, a in enumerate(names):
            lengths = [float(turn[a].gen.response_mask.float().sum(-1).mean()) for turn in length_turns]
            metrics[f"{a}/objective/scores"] = float(agent_scores[:, i].mean())
            metrics[f"{a}/response_length"] = sum(lengths) / len(lengths)
        for name, value in (getattr(self.env, "last_reward_components", None) or {}).items():
            metrics[f"rewards/{name}"] = float(value.float().mean())
        return metrics

    # ------------------------------------------------------------------ the loop (trainers/loop.py): its hooks
    def optimizer_steps_per_iteration(self) -> int:
        raise NotImplementedError

    def training_iteration(self, rows: list[dict]) -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------------ evaluation (trainers/evaluation.py)
    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", greedy: bool = False):
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None or len(dataset) == 0:
            raise ValueError(
                "`evaluate` needs an `eval_dataset` (at construction or as argument) with at least one row."
            )
        metrics = evaluation.mean_returns(self, dataset, metric_key_prefix, greedy)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    @torch.no_grad()
    def generate_completions(self, sampling: bool = False, num_rows: int = 4, show: bool = True) -> list[dict]:
        """Run a few episodes (eval set, else train set) and return (`show`: and print) each agent's completions."""
        dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
        rows = [dataset[i] for i in range(min(num_rows, len(dataset)))]
        table = evaluation.completion_table(self, rows, greedy=not sampling)
        if show and self.is_world_process_zero():
            evaluation.print_table(table, self.team.names)
        return table

    # ------------------------------------------------------------------ saving
    def team_description(self) -> dict:
        """The saved team's team.json (see `trl_collm.team.saved`)."""
        args = self.args
        # The sampling and prompt settings, so `trl-collm eval` / `play` (and the card) run the team as it was trained.
        desc = saved.describe_team(
            self.team,
            type(self).__name__,
            args.num_turns,
            args.preset,
            self.critic,
            generation=self.sampler.settings.to_team_json(),
            prompts=self.sampler.prompts.to_team_json(),
            base=self.base_identity,
        )
        if self.task_record is not None:
            desc["task"] = dict(self.task_record)
        return desc

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, task=None, output_dir=None):
        """The team card (README.md in output_dir, built by trl_collm.team.card in place of TRL's single-model card):
        each agent's base model, the task (`task`: a registry name or import path; default: the one `task_record`
        holds, as the CLI sets it), algorithm and critic, the last metrics, how to load and run the team."""
        from ..team.card import write_team_card

        task = task if task is not None else (self.task_record or {}).get("ref")
        if self.is_world_process_zero():
            write_team_card(
                self, model_name=model_name, dataset_name=dataset_name, tags=tags, task=task, output_dir=output_dir
            )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        include_critic: bool = True,
        **kwargs,
    ):
        """Publish the whole team: every agent folder, team.json, the team card and (unless include_critic=False)
        the critic. Extra keyword arguments (e.g. dataset_name) go to the model card."""
        return hub.push_team(self, commit_message, blocking, token, revision, include_critic, kwargs)

    def _single_agent(self) -> bool:
        return len(self.team.names) == 1

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        output_dir = output_dir or self.args.output_dir
        # ZeRO-3: parameters are partitioned; gather a full state dict (collective, every rank) and write from it.
        full = distributed.full_state_dict(self)
        self.accelerator.wait_for_everyone()
        if self.is_world_process_zero():
            with library_quiet():  # transformers' "Writing model shards" bars
                saved.write_team(output_dir, self.team, self.critic, self.team_description(), full)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
            # The card beside the team, from Python as from the CLI (which calls save_model too)
            self.create_model_card(model_name=os.path.basename(os.path.normpath(output_dir)), output_dir=output_dir)
        if self.args.push_to_hub and not _internal_call:  # as transformers: a user's save_model() also pushes
            self.push_to_hub(commit_message="Model save")  # every rank: it saves again (a collective under ZeRO-3)

    # ------------------------------------------------------------------ checkpoints
    @property
    def metrics_history(self) -> list[dict]:
        """The metrics of every iteration so far."""
        return self._metrics_history

    def checkpoint_state(self) -> dict:
        """Trainer state a checkpoint keeps besides parameters, optimizer, scheduler and RNG (see checkpoints.py)."""
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore what `checkpoint_state` returned."""


def _chunked(fn, total: int, size: int) -> torch.Tensor:
    """fn(slice) over [0, total) in chunks of `size`, concatenated along dim 0 (right-padding a ragged last dim)."""
    outs = [fn(slice(s, s + size)) for s in range(0, total, size)]
    if not outs:
        return torch.zeros(0)
    if outs[0].dim() > 1:
        width = max(o.shape[-1] for o in outs)
        outs = [torch.nn.functional.pad(o, (0, width - o.shape[-1])) for o in outs]
    return torch.cat(outs, dim=0)
