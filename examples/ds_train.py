"""Train a 2-agent team with DeepSpeed ZeRO-2 / ZeRO-3 (or without: plain one process), on tiny offline models.

    # 2 processes, ZeRO-2 (on a CPU-only machine DeepSpeed selects its CPU accelerator; the trainer uses gloo)
    accelerate launch --num_processes 2 --mixed_precision no \
        --config_file trl_collm/accelerate_configs/zero2.yaml examples/ds_train.py --out /tmp/z2
    # the same global batch in one plain process, for comparison
    python examples/ds_train.py --out /tmp/ref

Options: --layout separate|shared_base (two models, or two LoRA adapters on one base),
--critic centralized|decentralized, --global-batch (episodes per iteration over all processes), --iterations.
The tiny model is built in $TRL_COLLM_CACHE (build it before launching several processes). Rollouts are greedy
by default (--sample to sample): with sampling, each rank draws from its own RNG stream, so a 2-process run
cannot reproduce the 1-process samples.

Writes <out>/metrics.json (rank 0): per iteration, every metric averaged over the processes; rank 0's seconds in
rollout / scoring / update per iteration (`phases_s`); and the fingerprint
(sum, abs-sum in float64) of each agent's trained parameters at the end, gathered from all ranks under ZeRO-3.
Saves the team to <out>/team. --save-steps / --stop-after / --resume: checkpoints, a stopped run and its resume
(tests/test_deepspeed.py); --kill-in-save N: a run SIGKILLed inside DeepSpeed's save of checkpoint-N
(tests/test_deepspeed_kill.py); --inf-loss-iteration: a loss made infinite on rank 0 (the non-finite step guard);
--record-roles: each process's ranks and main-process roles (tests/test_multinode.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from trl_collm.testing import TOY_PROMPTS  # noqa: E402

PROMPTS = [
    *TOY_PROMPTS,
    "the value of the plan",
    "one and two and",
    "def main(a, b): return",
    "the agents agree on",
]


INSTRUCTIONS = "the team writes the plan and the critic gives a value to the plan of the team: "


def varied_reward(prompts, completions, **kwargs):
    """Joint reward that differs between episodes (so advantages are not all zero, even for greedy rollouts)."""
    return [float(len(c[0]) % 3) + 0.5 * float(len(c[-1]) % 2) for c in completions]


def fingerprints(trainer) -> dict:
    """Per agent: (sum, abs-sum) of its trained parameters, float64. Collective under ZeRO-3 (all ranks gather)."""
    from trl_collm.trainers import distributed

    params = list(trainer.model.parameters())
    ctx = torch.no_grad()
    if distributed.zero_stage(trainer) == 3:
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters(params)
    out = {}
    with ctx:
        for a in trainer.team.names:
            ps = trainer.team.agent_parameters(a)
            out[a] = [
                float(sum(p.detach().double().sum() for p in ps)),
                float(sum(p.detach().double().abs().sum() for p in ps)),
            ]
    return out


def time_phases(trainer) -> tuple[dict[str, list[float]], dict[str, list[int]], list[int]]:
    """Wrap the trainer's rollout / score_rollout / update (instance attributes) and record each call's seconds and,
    under ZeRO-3, how many times partitioned parameters were gathered: DeepSpeed's per-module fetches plus the
    whole-model gathers of `ds3_gather_for_training` (a count that does not depend on how busy the machine is)."""
    import time

    fetches = [0]
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator

        fetch = Coordinator.fetch_sub_module

        def counting_fetch(self, *a, **k):
            fetches[0] += 1
            return fetch(self, *a, **k)

        Coordinator.fetch_sub_module = counting_fetch
    times: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for phase in ("rollout", "score_rollout", "update"):
        fn = getattr(trainer, phase, None)
        if fn is None:  # MC has no separate scoring phase
            continue

        def unit_gathers():  # whole-model gathers of trainers/zero3_gathering.py (ds3_gather_for_training)
            gathering = getattr(trainer, "zero3_gathering", None)
            return gathering.gathers if gathering is not None else 0

        def timed(*a, _fn=fn, _phase=phase, **k):
            t0, f0 = time.perf_counter(), fetches[0] + unit_gathers()
            out = _fn(*a, **k)
            times.setdefault(_phase, []).append(time.perf_counter() - t0)
            counts.setdefault(_phase, []).append(fetches[0] + unit_gathers() - f0)
            return out

        setattr(trainer, phase, timed)
    return times, counts, fetches  # fetches[0]: DeepSpeed's per-module fetches so far


def add_test_hooks(trainer, cli) -> list:
    """--stop-after: stop as a preempted run would (after that iteration's checkpoint); --inf-loss-iteration: rank 0's
    losses of that iteration get +inf added (gradients stay finite). Returns the list that receives the agents'
    fingerprints before and after the poisoned iteration."""
    from transformers import TrainerCallback

    around = []

    class Hooks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == cli.inf_loss_iteration:
                around.append(fingerprints(trainer))  # collective under ZeRO-3: every rank runs the callbacks

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == cli.inf_loss_iteration:
                around.append(fingerprints(trainer))
            if state.global_step == cli.stop_after:
                control.should_training_stop = True

    trainer.add_callback(Hooks())
    if cli.kill_in_save:
        kill_inside_the_engine_save(trainer, cli.kill_in_save)
    if cli.inf_loss_iteration:
        losses = trainer.step_losses

        def poisoned(*a, **k):
            for loss, rows in losses(*a, **k):
                if trainer.state.global_step + 1 == cli.inf_loss_iteration and trainer.is_world_process_zero():
                    loss = loss + float("inf")
                yield loss, rows

        trainer.step_losses = poisoned
    return around


def kill_inside_the_engine_save(trainer, step: int) -> None:
    """--kill-in-save N: rank 0 is SIGKILLed inside DeepSpeed's save of checkpoint-N, right after the engine wrote
    its first file (its other shards, the optimizer state and the completion marker not yet), as a preemption or
    the OOM killer would stop it; the launcher then ends the other ranks."""
    import signal

    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    original = TorchCheckpointEngine.save

    def save(self, state_dict, path):
        original(self, state_dict, path)
        if trainer.state.global_step == step and trainer.is_world_process_zero():
            os.kill(os.getpid(), signal.SIGKILL)

    TorchCheckpointEngine.save = save


def averaged_history(trainer) -> list[dict]:
    """Every metric of every iteration, averaged over the processes (each rank holds an equal share of the batch)."""
    history = trainer._metrics_history
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return history
    world = torch.distributed.get_world_size()
    keys = sorted(k for k, v in history[0].items() if isinstance(v, (int, float)))
    values = torch.tensor([[float(m.get(k, 0.0)) for k in keys] for m in history], dtype=torch.float64)
    torch.distributed.all_reduce(values)
    values /= world
    return [dict(zip(keys, row.tolist())) for row in values]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--trainer", choices=["ppo", "mc"], default="ppo", help="MultiAgentPPOTrainer or MultiAgentMCTrainer"
    )
    parser.add_argument("--layout", choices=["separate", "shared_base"], default="separate")
    parser.add_argument("--critic", choices=["centralized", "decentralized"], default="centralized")
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--sample", action="store_true", help="sample the rollouts instead of greedy decoding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2, help="PPO epochs (1 with --kl-coef 0: the single-pass update)")
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="put one long instruction in front of every prompt (exercises the shared-prefix forward)",
    )
    parser.add_argument("--profile", default=None, help="write rank 0's cProfile of train() to this file")
    parser.add_argument(
        "--per-module-fetches",
        action="store_true",
        help="ZeRO-3 through DeepSpeed's per-module hooks in scoring and update (ds3_gather_for_training=False)",
    )
    parser.add_argument("--save-steps", type=int, default=0, help="write a checkpoint every N iterations (0: none)")
    parser.add_argument("--stop-after", type=int, default=0, help="stop after N iterations (as a preempted run)")
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint in --out")
    parser.add_argument(
        "--kill-in-save", type=int, default=0, help="SIGKILL rank 0 inside DeepSpeed's save of checkpoint-N"
    )
    parser.add_argument(
        "--inf-loss-iteration",
        type=int,
        default=0,
        help="rank 0's losses of iteration N become +inf (finite gradients); records the weights around it",
    )
    parser.add_argument(
        "--record-roles",
        action="store_true",
        help="every process writes <out>/roles-<rank>.json: its ranks and whether it is a main process",
    )
    cli = parser.parse_args()

    torch.set_num_threads(1)
    from datasets import Dataset

    import trl_collm.team.prefix

    shared_prefix_used = []  # how many forwards computed a shared prefix once (reported in metrics.json)
    plain_split = trl_collm.team.prefix.plan_split

    def counting_split(*a, **k):
        split = plain_split(*a, **k)
        shared_prefix_used.append(split is not None)
        return split

    trl_collm.team.prefix.plan_split = counting_split
    if cli.instructions:
        # The tiny model's layers are so cheap that the cost model would run the plain forward; this option exists to
        # exercise the shared-prefix forward under DeepSpeed, so every cut that saves tokens is taken.
        trl_collm.team.prefix.CALL_COST_TOKENS = 0

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import tiny_model_dir

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cli.global_batch % world:
        raise SystemExit(f"--global-batch {cli.global_batch} must be a multiple of the {world} processes")
    model_path = tiny_model_dir("tiny-qwen2")
    common = dict(
        output_dir=cli.out,
        num_agents=2,
        per_device_train_batch_size=cli.global_batch // world,  # one micro-batch per rank per minibatch
        num_mini_batches=1,
        total_episodes=cli.global_batch * cli.iterations,
        response_length=6,
        learning_rate=1e-3,
        grad_clip_scope="global",  # DeepSpeed clips the global norm only
        max_grad_norm=1.0,
        bf16=False,
        report_to=[],
        save_strategy="steps" if cli.save_steps else "no",
        save_steps=cli.save_steps or 500,
        num_sample_generations=0,
        disable_tqdm=True,
        logging_steps=1,
        seed=cli.seed,
        ds3_gather_for_training=not cli.per_module_fetches,
    )
    if cli.trainer == "mc":
        args = MultiAgentMCConfig(num_generations=2, **common)
    else:
        args = MultiAgentPPOConfig(
            critic_type=cli.critic,
            num_ppo_epochs=cli.epochs,
            kl_coef=cli.kl_coef,  # 0.05 exercises the reference policies (frozen copies / the base with adapters off)
            # Per-rank whitening (TRL's PPO semantics) would differ from whitening the whole batch in one process.
            advantage_norm_scope="none",
            **common,
        )
    peft_config = None
    if cli.layout == "shared_base":
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer_cls = MultiAgentMCTrainer if cli.trainer == "mc" else MultiAgentPPOTrainer
    trainer = trainer_cls(
        args=args,
        model=model_path,
        peft_config=peft_config,
        reward_funcs=varied_reward,
        # Exactly one global batch of rows: every iteration plays the same episodes whatever the process count
        # (the shuffled order differs between 1 process and accelerate's sharded loader, the set of rows does not).
        train_dataset=Dataset.from_dict(
            {"prompt": [INSTRUCTIONS * cli.instructions + p for p in PROMPTS[: cli.global_batch]]}
        ),
    )
    if not cli.sample:
        greedy = dataclasses.replace(trainer.sampler.settings, greedy=True)
        trainer.sampler = trainer.sampler.with_settings(greedy)
    phases, fetches, module_fetches = time_phases(trainer)
    around_poison = add_test_hooks(trainer, cli)
    if cli.profile and trainer.is_world_process_zero():
        import cProfile

        cProfile.runctx("trainer.train()", globals(), {"trainer": trainer}, cli.profile)
    else:
        trainer.train(resume_from_checkpoint=True if cli.resume else None)
    if cli.record_roles:  # what multi-node changes: a main process per node, and one global main
        roles = {
            "rank": trainer.accelerator.process_index,
            "local_rank": trainer.accelerator.local_process_index,
            "node": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
            "is_local_main": trainer.is_local_process_zero(),
            "is_world_main": trainer.is_world_process_zero(),
            "should_save": trainer.args.should_save,  # writes checkpoints and the team, pushes to the Hub
            "should_log": trainer.args.should_log,  # prints and reports metrics (log_on_each_node)
        }
        with open(os.path.join(cli.out, f"roles-{roles['rank']}.json"), "w") as f:
            json.dump(roles, f)
    team_dir = os.path.join(cli.out, "team")
    trainer.save_model(team_dir)
    history = averaged_history(trainer)
    prints = fingerprints(trainer)
    gathering = getattr(trainer, "zero3_gathering", None)  # ds3_gather_for_training's whole-model gathers
    if trainer.is_world_process_zero():
        info = {
            "world_size": trainer.accelerator.num_processes,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "zero_stage": __import__("trl_collm.trainers.distributed", fromlist=["zero_stage"]).zero_stage(trainer),
            "layout": cli.layout,
            "critic": cli.critic,
            "history": history,
            "fingerprints": prints,
            "team_dir": team_dir,
            "deferred_old_logprobs": bool(trainer.plan and trainer.plan.old_logprobs_from_update.on),
            "shared_prefix_forwards": sum(shared_prefix_used),
            # rank 0's seconds per call of each phase (the first iteration includes warm-up)
            "phases_s": phases,
            "zero3_fetches": fetches,  # per call of each phase: ZeRO-3 parameter fetches on rank 0 (0 without ZeRO-3)
            # the same over the whole run, split: DeepSpeed's per-module fetches and ds3_gather_for_training's gathers
            "zero3_module_fetches": module_fetches[0],
            "zero3_unit_gathers": gathering.gathers if gathering else 0,
            "zero3_gather_s": gathering.gather_seconds if gathering else 0,
            "fingerprints_around_inf_loss": around_poison,  # [before, after] iteration --inf-loss-iteration
        }
        with open(os.path.join(cli.out, "metrics.json"), "w") as f:
            json.dump(info, f, indent=1)
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # ZeRO-3 may abort at exit otherwise


if __name__ == "__main__":
    main()
    # Every rank has finished and left the process group: skip the interpreter's teardown, where a C++ thread left
    # running by torch / DeepSpeed can abort the process ("terminate called without an active exception", seen once
    # in CI after a 2-process ZeRO-3 run had finished) and turn a finished run into a failed launch.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
