"""One comlrl 1.4.3 training run on the shared task; prints one JSON line. Runs in
benchmarks/compare/vs_comlrl/.venv-comlrl (see setup_env.sh), never in trl_collm's environment.

    .venv-comlrl/bin/python run_theirs.py --algo cc --models M0 M1 [--episodes 512 ...]

cc = MAACTrainer (one shared critic, V over the joint prompt), dc = IACTrainer (a separate critic per agent),
mc = MAGRPOTrainer (critic-free, group baseline over G samples). Every run: num_turns 1, no evaluation, no wandb,
the stop token set outside the vocabulary so every response runs to --max-new-tokens (as in run_ours.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets HF_HUB_OFFLINE / WANDB_MODE before the libraries load)
import task  # noqa: E402


def main(argv=None) -> int:
    opts = common.parse_run_args(__doc__, argv)
    import comlrl
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    counter = common.GenerateCounter()
    log = task.RewardLog()
    reward = task.reward_for_comlrl(log)
    paths = list(opts.models)
    toks = [AutoTokenizer.from_pretrained(p) for p in paths]
    never = len(toks[0])  # an id outside the vocabulary: never sampled, so generation never stops early
    common.seed_everything(opts.seed)
    t_build = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        if opts.algo in ("cc", "dc"):
            rows = opts.episodes  # one joint action per prompt (num_generations 1)
            shared = dict(
                agent_learning_rate=opts.lr,
                critic_learning_rate=opts.lr,
                rollout_buffer_size=opts.batch,  # one actor step + one critic step per agent every `batch` episodes
                max_new_tokens=opts.max_new_tokens,
                temperature=opts.temperature,
                top_p=opts.top_p,
                top_k=opts.top_k,
                num_train_epochs=1,
                num_agents=2,
                num_generations=1,
                num_turns=1,
                discount=1.0,
                critic_type="v",
                eval_interval=0,
                early_termination_threshold=None,
                agent_devices=opts.device,
                critic_devices=opts.device,  # one device for all, as ours
            )
            ds = Dataset.from_dict(task.dataset_rows(rows))
            if opts.algo == "cc":
                trainer = MAACTrainer(
                    agents=paths,
                    critics=[paths[0]],
                    tokenizer=toks,
                    reward_func=reward,
                    formatters=task.FORMATTERS,
                    args=MAACConfig(**shared),
                    train_dataset=ds,
                )
                critics = trainer.critics
            else:
                trainer = IACTrainer(
                    agents=paths,
                    critics=paths,
                    tokenizer=toks,
                    reward_func=reward,
                    formatters=task.FORMATTERS,
                    args=IACConfig(use_separate_critic=True, **shared),
                    train_dataset=ds,
                )
                critics = trainer.critics
            for agent in trainer.agents:
                agent.model.generation_config.eos_token_id = never
            trainer.verbose = False
            train_kwargs = {}
            n_params = sum(p.numel() for p in trainer.agents[0].parameters())
            n_critics = len(critics)
        else:
            g = opts.num_generations
            rows = opts.episodes // g
            args = MAGRPOConfig(
                num_train_epochs=1,
                agent_learning_rate=opts.lr,
                num_agents=2,
                num_generations=g,
                max_new_tokens=opts.max_new_tokens,
                temperature=opts.temperature,
                top_p=opts.top_p,
                top_k=opts.top_k,
                num_turns=1,
                eval_interval=0,
                early_termination_threshold=None,
                agent_devices=opts.device,
                rollout_buffer_size=opts.batch // g,  # prompts per optimizer step (each with G samples per agent)
                logging_steps=10**9,
            )
            ds = Dataset.from_dict(task.dataset_rows(rows))
            trainer = MAGRPOTrainer(
                agents=paths,
                num_agents=2,
                tokenizer=toks,
                reward_func=reward,
                formatters=task.FORMATTERS,
                args=args,
                train_dataset=ds,
            )
            for agent in trainer.agents:
                agent.generation_config.eos_token_id = never
            trainer.verbose = False
            train_kwargs = {"eos_token_id": never}  # MAGRPO forwards train() kwargs to generate()
            n_params = sum(p.numel() for p in trainer.agents[0].parameters())
            n_critics = 0
        t_build = time.perf_counter() - t_build
        t0 = time.perf_counter()
        trainer.train(**train_kwargs)
        train_s = time.perf_counter() - t0

    episodes = len(log.rewards)
    result = dict(
        lib="comlrl",
        version=comlrl.__version__,
        algo=opts.algo,
        trainer=type(trainer).__name__,
        torch=torch.__version__,
        transformers=transformers.__version__,
        threads=torch.get_num_threads(),
        models=paths,
        params_per_agent=n_params,
        critics=n_critics,
        dataset_rows=rows,
        episodes=episodes,
        train_s=train_s,
        build_s=t_build,
        episodes_per_s=episodes / train_s,
        gen_tokens=counter.tokens,
        gen_calls=counter.calls,
        gen_tokens_per_s=counter.tokens / train_s,
        generate_s=counter.seconds,
        peak_rss_mib=common.peak_rss_mib(),
        peak_gpu_mib=common.peak_gpu_mib(),
        device=common.device_name(opts.device),
        env_steps=int(getattr(trainer, "env_step", -1)),
        settings=vars(opts),
        **log.summary(opts.tail),
    )
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
