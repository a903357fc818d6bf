"""One trl_collm training run on the shared task; prints one JSON line. Runs in trl_collm's own environment.

    python run_ours.py --algo cc --models M0 M1 [--episodes 512 ...]

cc = MultiAgentPPOTrainer, centralized critic (preset "collm-1.4", one team value over the joint view: the rule of
comlrl 1.4.3's MAACTrainer); dc = the same with critic_type="decentralized" (one critic per agent, IACTrainer's
layout); mc = MultiAgentMCTrainer, preset "magrpo" with scale_advantages=True (comlrl 1.4.3's MAGRPOTrainer divides
the mean-centred returns by the group's std by default). Learning rate, optimizer (AdamW, weight decay 0.01 = torch's
default, which comlrl uses), sampling and batch size as in run_theirs.py; the stop token is set outside the
vocabulary so every response runs to --max-new-tokens. --no-prefix-sharing turns off the shared-prefix forward
(`share_prompt_prefix=False`), so that every row computes its whole prompt, as comlrl does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import task  # noqa: E402


def main(argv=None) -> int:
    opts = common.parse_run_args(
        __doc__,
        argv,
        extra=lambda p: p.add_argument(
            "--no-prefix-sharing",
            action="store_true",
            help="share_prompt_prefix=False: every row computes its whole prompt",
        ),
    )
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer

    import trl_collm
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    counter = common.GenerateCounter()
    log = task.RewardLog()
    reward = task.reward_for_trl_collm(log)
    paths = list(opts.models)
    tok = AutoTokenizer.from_pretrained(paths[0])
    common.seed_everything(opts.seed)
    with tempfile.TemporaryDirectory(prefix="vs-comlrl-ours-") as out_dir, contextlib.redirect_stdout(sys.stderr):
        shared = dict(
            output_dir=out_dir,
            agent_names=["player_1", "player_2"],
            learning_rate=opts.lr,
            weight_decay=0.01,
            response_length=opts.max_new_tokens,
            temperature=opts.temperature,
            top_p=opts.top_p,
            top_k=opts.top_k,
            stop_token_id=len(tok),  # never sampled: responses always run to response_length
            num_train_epochs=1,
            use_cpu=opts.device == "cpu",
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            num_sample_generations=0,
            seed=opts.seed,
            disable_tqdm=True,
            share_prompt_prefix=not opts.no_prefix_sharing,
        )
        t_build = time.perf_counter()
        if opts.algo in ("cc", "dc"):
            rows = opts.episodes
            args = MultiAgentPPOConfig(
                preset="collm-1.4",
                critic_type="centralized" if opts.algo == "cc" else "decentralized",
                centralized_value="team",
                critic_learning_rate=opts.lr,
                per_device_train_batch_size=opts.batch,  # episodes per iteration = comlrl's rollout_buffer_size
                total_episodes=rows,
                **shared,
            )
            trainer = MultiAgentPPOTrainer(
                args=args,
                model=paths,
                train_dataset=Dataset.from_dict(task.dataset_rows(rows)),
                reward_funcs=reward,
                prompt_formatters=task.FORMATTERS,
            )
            n_critics = len(trainer.critic.units)
        else:
            g = opts.num_generations
            rows = opts.episodes // g
            args = MultiAgentMCConfig(
                preset="magrpo",
                scale_advantages=True,
                num_generations=g,
                per_device_train_batch_size=opts.batch // g,  # prompts per iteration = comlrl's rollout_buffer_size
                total_episodes=rows,
                **shared,  # MC counts dataset rows (prompts) as episodes
            )
            trainer = MultiAgentMCTrainer(
                args=args,
                model=paths,
                train_dataset=Dataset.from_dict(task.dataset_rows(rows)),
                reward_funcs=reward,
                prompt_formatters=task.FORMATTERS,
            )
            n_critics = 0
        t_build = time.perf_counter() - t_build
        n_params = sum(p.numel() for p in trainer.team.policies[trainer.team.names[0]].parameters())
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0

    episodes = len(log.rewards)
    result = dict(
        lib="trl_collm",
        version=getattr(trl_collm, "__version__", "?"),
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
        settings=vars(opts),
        **log.summary(opts.tail),
    )
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
