"""MultiAgentPPOTrainer with one agent against TRL 1.12's PPOTrainer (`trl.experimental.ppo`), through the same
`ppo.py` script, side by side, alternating runs.

    python benchmarks/compare/vs_trl/ppo_vs_trl112.py                            # tiny models, 3 rounds, CPU
    python benchmarks/compare/vs_trl/ppo_vs_trl112.py --size small --rounds 2 --json docs/data/vs_trl_ppo_cpu.json

`examples/ppo.py` is written the way scripts for TRL's last PPOTrainer were; its one trl-collm-specific line imports
`MultiAgentPPOTrainer as PPOTrainer`. The TRL side runs that same file with that import answered by TRL 1.12's
`PPOConfig` / `PPOTrainer`, in its own virtualenv (created on first use at --venv: `trl==1.12.0` installed there with
pip, everything else read from this environment; TRL 1.12 is never a dependency of trl_collm). Same policy, reference,
reward and value models (the offline factory's random-init models), the same prompts, batch, response length,
epochs, learning rate and seed. Each run is a fresh process, so its peak RSS is its own.

Reported per side: completions/s over `train()` (median over rounds), peak RSS, the mean score per iteration
(learning curve, averaged over rounds). `trl-nogc` is TRL 1.12 with `gc.collect()` made a no-op (it calls it twice
per iteration, which costs more than the arithmetic on small models): the two sides' arithmetic alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # benchmarks/compare/<this folder>
SCRIPT = os.path.join(ROOT, "examples", "ppo.py")
TRL_SPEC = "trl==1.12.0"
PROMPTS = [
    f"Write {w} words about the {t}:" for w in ("three", "five", "seven", "ten") for t in ("sea", "tree", "cat", "city")
]


def ensure_venv(venv: str) -> str:
    """A virtualenv holding only TRL 1.12; torch, transformers and the rest come from this interpreter's site-packages
    (a .pth file placed after the venv's own packages, so its trl shadows ours)."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".ready")):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        import site
        import sysconfig

        own = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        parents = [p for p in site.getsitepackages() if os.path.isdir(p)] + [sysconfig.get_paths()["purelib"]]
        with open(os.path.join(own, "zz_parent_env.pth"), "w") as f:
            f.write("\n".join(dict.fromkeys(parents)) + "\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", own, TRL_SPEC], check=True
        )
        open(os.path.join(venv, ".ready"), "w").close()
    return python


def run_side(a, ppo_args: list[str]) -> dict:
    """Inside the worker process: run examples/ppo.py with the side's trainer and time its train()."""
    import torch

    torch.set_num_threads(a.threads)
    if a.side.startswith("trl"):
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        if a.side == "trl-nogc":
            # TRL 1.12 runs gc.collect() twice per iteration; with it off, the two sides differ only in arithmetic.
            import gc

            gc.collect = lambda *args, **kwargs: 0

        shim = types.ModuleType("trl_collm")
        shim.MultiAgentPPOConfig, shim.MultiAgentPPOTrainer = PPOConfig, PPOTrainer  # the script's one import
        sys.modules["trl_collm"] = shim
        trainer_cls = PPOTrainer
    else:
        from trl_collm import MultiAgentPPOTrainer as trainer_cls
    import trl

    result = {"side": a.side, "trl": trl.__version__}
    train = trainer_cls.train

    def timed_train(self, *args, **kwargs):
        profile = None
        if a.profile:  # cProfile of train() only, one file per side (overwritten each round)
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        t0 = time.perf_counter()
        out = train(self, *args, **kwargs)
        result["train_s"] = time.perf_counter() - t0
        if profile is not None:
            profile.disable()
            profile.dump_stats(f"{a.profile}.{a.side}.prof")
        result["score_curve"] = [h["objective/scores"] for h in self.state.log_history if "objective/scores" in h]
        result["iterations"] = len(result["score_curve"])
        return out

    trainer_cls.train = timed_train
    sys.argv = [SCRIPT, *ppo_args]
    runpy.run_path(SCRIPT, run_name="__main__")
    result["completions"] = a.episodes
    result["completions_per_s"] = a.episodes / result["train_s"]
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["ours", "trl", "trl-nogc"], default=None, help="(internal) run one side")
    p.add_argument("--sides", nargs="+", default=["ours", "trl", "trl-nogc"])
    p.add_argument("--size", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--response-length", type=int, default=16)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--venv", default=os.path.join(tempfile.gettempdir(), "trl_collm-venv-trl112"))
    p.add_argument("--data", default=None, help="(internal) prompt folder")
    p.add_argument("--model", default=None, help="(internal) model folder")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", default=None, help="write each side's cProfile of train() to PROFILE.<side>.prof")
    a = p.parse_args()
    if a.side:
        out = tempfile.mkdtemp(prefix=f"vs-trl-ppo-{a.side}-")
        ppo_args = [
            "--dataset_name",
            a.data,
            "--output_dir",
            out,
            "--learning_rate",
            str(a.lr),
            "--per_device_train_batch_size",
            str(a.batch),
            "--gradient_accumulation_steps",
            "1",
            "--total_episodes",
            str(a.episodes),
            "--num_ppo_epochs",
            str(a.epochs),
            "--num_mini_batches",
            "1",
            "--model_name_or_path",
            a.model,
            "--sft_model_path",
            a.model,
            "--reward_model_path",
            a.model,
            "--response_length",
            str(a.response_length),
            "--missing_eos_penalty",
            "1.0",
            "--seed",
            str(a.seed),
            "--use_cpu",
            "--bf16",
            "False",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--logging_steps",
            "1",
            "--num_sample_generations",
            "0",
            "--disable_tqdm",
            "True",
            "--dataset_num_proc",
            "1",
            "--gradient_checkpointing",
            "False",  # TRL's config turns it on by default; ours does not checkpoint
        ]
        result = run_side(a, ppo_args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from trl_collm.testing import tiny_model_dir

    model = tiny_model_dir(f"{a.size}-qwen2", size=a.size) if a.size != "tiny" else tiny_model_dir("tiny-qwen2")
    trl_python = ensure_venv(a.venv)
    pythons = {side: sys.executable if side == "ours" else trl_python for side in a.sides}
    data = tempfile.mkdtemp(prefix="vs-trl-ppo-data-")
    rows = PROMPTS * (1 + (a.episodes + 100) // len(PROMPTS))
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": r}) + "\n" for r in rows[: a.episodes])
    with open(os.path.join(data, "test.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": r}) + "\n" for r in PROMPTS[:4])
    forwarded = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(a).items()
        if k not in ("side", "sides", "rounds", "json", "venv", "data", "model") and v is not None
    ]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    runs: dict[str, list[dict]] = {side: [] for side in a.sides}
    for r in range(a.rounds):
        for side in a.sides if r % 2 == 0 else list(reversed(a.sides)):  # alternate who goes first
            proc = subprocess.run(
                [pythons[side], __file__, "--side", side, f"--data={data}", f"--model={model}", *forwarded],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
            runs[side].append(json.loads(lines[-1][len("RESULT ") :]))
            print(
                f"round {r} {side} (trl {runs[side][-1]['trl']}): {runs[side][-1]['completions_per_s']:.1f} "
                "completions/s",
                flush=True,
            )
    summary = {}
    for side, rs in runs.items():
        curves = [x["score_curve"] for x in rs]
        summary[side] = {
            "completions_per_s": statistics.median(x["completions_per_s"] for x in rs),
            "peak_rss_mib": statistics.median(x["peak_rss_mib"] for x in rs),
            "score_curve": [statistics.mean(c[i] for c in curves) for i in range(min(len(c) for c in curves))],
        }
    base = summary.get("trl", next(iter(summary.values())))["completions_per_s"]
    print(
        f"\n{'side':<8} {'completions/s':>13} {'x TRL':>6} {'peak RSS MiB':>12}  score per iteration (mean of rounds)"
    )
    for side, s in summary.items():
        curve = " ".join(f"{v:.3f}" for v in s["score_curve"])
        print(
            f"{side:<8} {s['completions_per_s']:>13.1f} {s['completions_per_s'] / base:>6.2f} "
            f"{s['peak_rss_mib']:>12.0f}  {curve}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
