"""The paper's tasks learned by a real model: LoRA teams of SmolLM2-135M-Instruct (trl_collm.team.pretrained) on
writing-summary (the paper's TLDR task: CC vs DC vs MC), writing-revise (the same over 2 turns, a draft then a revision,
the reward at the end: where a critic should matter) and code-humaneval (2 turns, sandbox on: CC vs MC).

Every method trains LoRA adapters (one per agent, plus the critic's for CC/DC) on the same shared base, from the
same model, at the same environment-step budget (one env step = one joint action scored by the env; an MC prompt
expanded per branch costs G x turns). The learning rate is chosen per method the same way for all (as
warm_findings.py does): each method runs at each of its rates on the sweep seed, the rate with the best final
training return is kept, and the other seeds run at it. Before training (the starting model) and after, the team
plays the task's held-out rows (temperature 1, a fixed seed) and each reward level's pass rate is recorded.

    python benchmarks/research/real_findings.py writing-summary --jobs 2      # the writing table (3 methods x 3 seeds)
    python benchmarks/research/real_findings.py writing-revise --jobs 2       # the 2-turn table (3 methods x 3 seeds)
    python benchmarks/research/real_findings.py code-humaneval --jobs 2       # the code table (CC vs MC, 2 seeds)
    python benchmarks/research/real_findings.py writing-summary --report-only # tables and figure from the runs so far
    python benchmarks/research/real_findings.py writing-summary --resample-seeds 1235 1236  # + the start re-sampled
    python benchmarks/research/real_findings.py writing-summary --smoke       # 1 seed, 1 rate, 2 iterations, 8 tokens

Resumable: each run writes OUT_DIR/<task>/<method>-seed<S>-lr<LR>-b<BUDGET>.json when it finishes (and the starting
model's scores start.json); a later call skips what exists, so an interrupted sweep continues where it stopped. A run
itself checkpoints every SAVE_EVERY iterations under RUNS_DIR and a killed run resumes from its last checkpoint
(bitwise, as the trainers resume), so an interrupted run loses at most SAVE_EVERY iterations.

Held-out plays are paired: the trained team and the starting model play the same posts at the same sampling seed, so
the change of each play is measured against its own starting play (mean +- standard error over plays), beside the
starting model's own re-sampling range (`--resample-seeds`).
The table is built from whatever runs exist and says how many seeds and env steps each cell has against the target.
Each method's row carries its between-seed spread (SD over seeds; min to max), and each pair of methods a bootstrap
interval on the difference of their held-out returns (method_intervals.py: seeds drawn within each method, plays
within each run, paired with the starting model's plays; a fixed bootstrap seed, so the same files give the same
interval). Writes OUT_DIR/real_findings_<task>-<size>.json (the table), PREFIX_<task>-<size>_curves.png (training
curves) and PREFIX_<task>-<size>_heldout.png (held-out returns per seed), <size> as in the run files (e.g.
b128-bs8-t96-bf16), so tables of other sizes keep their own files; prints the table (Markdown). --compute auto picks
the dtype of this CPU: a report of another dtype's table names it (--compute bf16 / fp32).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from method_intervals import difference_lines, play_changes
from paper_findings import COLOURS, plot_seed_band, saved_figure  # one implementation of each measure
from warm_findings import choose_rates, format_table, method_config, table

MODEL = "smollm2-135m-instruct"
EVAL_SEED = 1234
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
# The paper's Table 1 (second-hand, ../shared/paper.md): TLDR score, % of the max reward.
PAPER_TLDR = {"warm": 30.3, "mc": 93.5, "dc": 95.4, "cc": 95.2}
TASKS = {
    "writing-summary": dict(
        methods=("cc", "dc", "mc"),
        seeds=(0, 1, 2),
        budget=128,  # env steps = episodes (1 turn); MC: 32 prompts x G = 4
        batch=8,  # episodes (PPO) or samples (MC) per iteration
        response_length=96,  # ~70 words: room for the detailed part's 60-120 window, the concise part must stop
        eval_limit=None,  # all 86 held-out posts, one play each: SE ~0.04-0.1 on a paired change of the return
        eval_repeats=1,
        lrs=(1e-3, 3e-3),  # 3e-3 learned MC about twice as fast as 1e-3 in the probe of issue 28 (and overshot)
        max_reward=3.0,
        describe="2 writers, 1 turn, level-gated reward (length, ratio, style)",
    ),
    # writing-summary drafted, then revised with the teammate's draft in view, paid at the end (issue 46: where the
    # critic should matter). 256 env steps = 128 episodes of 2 turns, writing-summary's 16 iterations; the writing
    # table's two rates and its rule (each rate on seed 0, the better final training return kept; 3e-3 won for all
    # three methods, docs/real_findings.md).
    "writing-revise": dict(
        methods=("cc", "dc", "mc"),
        seeds=(0, 1, 2),
        budget=256,
        batch=8,
        response_length=96,
        eval_limit=None,
        eval_repeats=1,
        lrs=(1e-3, 3e-3),
        max_reward=3.0,
        describe="2 writers, 2 turns (draft, then revision seeing the teammate's draft), reward at the end only",
    ),
    "code-humaneval": dict(
        methods=("cc", "mc"),
        seeds=(0, 1),
        budget=64,  # env steps (an episode is 1 or 2); MC: 8 prompts x G = 4 x 2 turns
        batch=4,
        response_length=128,
        eval_limit=16,  # of the 32 held-out problems
        eval_repeats=1,
        lrs=(3e-4, 1e-3),
        max_reward=4.0,
        describe="aux + main, 2 turns with test feedback, level-gated reward (sandbox)",
    ),
}
WRITING_TASKS = ("writing-summary", "writing-revise")  # scored by writing-summary's levels
SMOKE = dict(budget=8, batch=4, response_length=8, eval_limit=2, eval_repeats=1, seeds=(0,))
# The runs' checkpoints, outside the work tree (laid anew each session) so a later session on the same machine resumes
# them; removed when a run has finished. TRL_COLLM_RUNS_DIR overrides.
RUNS_DIR = os.environ.get("TRL_COLLM_RUNS_DIR") or os.path.expanduser("~/.cache/trl-collm/real_findings")
SAVE_EVERY = 4  # iterations between a run's checkpoints
SHOWN_TEXTS = 3  # held-out texts kept per evaluation, with their word counts


def settings(
    task: str, smoke: bool = False, budget: int | None = None, batch: int | None = None, compute: str = "fp32"
) -> dict:
    """The task's run settings; `compute` "bf16" trains under bf16 autocast (float32 master weights and losses),
    "auto" picks bf16 where this CPU has native bf16 (trl_collm.hardware), else float32."""
    s = dict(TASKS[task])
    if compute == "auto":
        import torch

        from trl_collm.hardware import cpu_has_native_bf16

        if torch.cuda.is_available():
            compute = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        else:
            compute = "bf16" if cpu_has_native_bf16() else "fp32"
    s["compute"] = compute
    if smoke:
        s.update(SMOKE, lrs=s["lrs"][:1])
    if budget is not None:
        s["budget"] = int(budget)
    if batch is not None:
        s["batch"] = int(batch)
    return s


# ------------------------------------------------------------------------------------------- scoring


def prompt_form(tokenizer, roll) -> str:
    """ "chat" when the first agent's first prompt went through the model's chat template, else "plain"."""
    gen = roll.turns[0][roll.agent_names[0]].gen
    ids = gen.query_ids[0][gen.query_mask[0].bool()].tolist()
    return "chat" if "<|im_start|>" in tokenizer.decode(ids) else "plain"


def final_texts(roll) -> list[dict]:
    """Per episode, {agent: text} of its last turn (writing-revise's final texts; writing-summary's only ones)."""
    last = [None] * roll.num_episodes
    a0 = roll.agent_names[0]
    for turn in roll.turns:
        for k, e in enumerate(turn[a0].episode_ids.tolist()):
            last[e] = {a: turn[a].gen.texts[k] for a in roll.agent_names}
    return last


def writing_levels(roll) -> list[dict]:
    """Per episode: the three level scores of its final texts (recomputed from the texts, as the env scores them)."""
    from trl_collm.tasks.writing import SUMMARY_RULES, score_pair

    out = []
    for row, texts in zip(roll.rows, final_texts(roll)):
        s = score_pair(*(texts[a] for a in SUMMARY_RULES.parts), row["document"], SUMMARY_RULES)
        out.append(dict(total=s.total, level1=s.level1, level2=s.level2, level3=s.level3, words=s.details["words"]))
    return out


def code_levels(roll) -> list[dict]:
    """Per episode: the final attempt's level points of code-humaneval (from the env's infos of its last turn)."""
    last = [None] * roll.num_episodes
    for t, infos in enumerate(roll.infos):
        ids = roll.turns[t][roll.agent_names[0]].episode_ids.tolist()
        for e, info in zip(ids, infos):
            last[e] = dict(info, turns=t + 1)
    out = []
    for info in last:
        lv = info["levels"]
        out.append(
            dict(
                total=info["score"],
                definitions=lv.get("definitions", 0.0),
                syntax=lv.get("syntax", 0.0),
                tests=lv.get("tests", 0.0),
                bonus=lv.get("bonus", 0.0),
                all_tests=info["tests_total"] > 0 and info["tests_passed"] == info["tests_total"],
                turns=info["turns"],
            )
        )
    return out


def summarize(task: str, per_episode: list[dict], max_reward: float) -> dict:
    """Mean return, % of the max (the paper's score), and each level's pass rate over the played episodes."""
    n = len(per_episode)

    def rate(pred):
        return sum(1 for e in per_episode if pred(e)) / n

    out = dict(episodes=n, return_mean=sum(e["total"] for e in per_episode) / n)
    out["score_pct"] = 100.0 * out["return_mean"] / max_reward
    if task in WRITING_TASKS:
        out.update(
            length_pass=rate(lambda e: e["level1"] >= 1.0),  # both parts inside their word windows
            ratio_pass=rate(lambda e: e["level2"] >= 1.0),  # ... and detailed/concise in [2, 4]
            style_mean=sum(e["level3"] for e in per_episode) / n,  # level 3 is graded (0..1), not pass/fail
            style_pass=rate(lambda e: e["level3"] >= 0.8),
            words_mean=[sum(e["words"][i] for e in per_episode) / n for i in range(2)],
        )
        out["concise_words"], out["detailed_words"] = out["words_mean"]
    else:
        out.update(
            definitions_pass=rate(lambda e: e["definitions"] >= 1.0),  # both aux and the entry point defined
            syntax_pass=rate(lambda e: e["syntax"] > 0),
            tests_mean=sum(e["tests"] for e in per_episode) / n / 2.0,  # mean fraction of tests passed
            all_tests_pass=rate(lambda e: e["all_tests"]),
            bonus_pass=rate(lambda e: e["bonus"] > 0),
        )
    return out


def evaluate(task: str, s: dict, team, eval_seed: int = EVAL_SEED) -> dict:
    """`team` on the held-out rows, sampled at temperature 1 with sampling seed `eval_seed`."""
    from transformers import AutoTokenizer

    from trl_collm.tasks import get_task
    from trl_collm.team.pretrained import smollm2_135m_instruct
    from trl_collm.warmstart import rollout_team

    rows = list(get_task(task).load_dataset("eval"))
    rows = rows[: s["eval_limit"]] if s["eval_limit"] else rows
    rows = [r for r in rows for _ in range(s["eval_repeats"])]
    t0, c0 = time.time(), time.process_time()
    _, roll = rollout_team(None, rows, task=task, max_new_tokens=s["response_length"], seed=eval_seed, team=team)
    per_episode = writing_levels(roll) if task in WRITING_TASKS else code_levels(roll)
    out = summarize(task, per_episode, s["max_reward"])
    out["plays"] = [dict(e, row=r["id"]) for e, r in zip(per_episode, rows)]  # for paired before/after changes
    out["seconds"], out["cpu_seconds"] = time.time() - t0, time.process_time() - c0
    out["eval_seed"] = eval_seed
    out["prompt_form"] = prompt_form(AutoTokenizer.from_pretrained(smollm2_135m_instruct()), roll)
    out["examples"] = final_texts(roll)[:SHOWN_TEXTS]
    return out


# ------------------------------------------------------------------------------------------- one run


def curves(history, args) -> tuple[list, list]:
    """(env steps, mean training return) per iteration, and each iteration's per-level training rewards."""
    steps, curve, levels = 0, [], []
    for m in history:
        # MC counts its nodes; PPO plays batch episodes of objective/turns turns each
        steps += round(m["mc/nodes"] if "mc/nodes" in m else args.per_device_train_batch_size * m["objective/turns"])
        curve.append((steps, m["objective/scores"]))
        levels.append({k: v for k, v in m.items() if k.startswith("rewards/")})
    return curve, levels


def _progress_callback(trainer, args, path, meta):
    """A callback writing the run's curve so far after every iteration (to `path`, marked partial): a run stopped
    before its end (a deadline, a crash) still leaves a usable partial curve; the finished run's file replaces it."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_step_end(self, *_, **__):
            curve, levels = curves(trainer.metrics_history, args)
            row = dict(meta, partial=True, env_steps=curve[-1][0], curve=curve, level_curves=levels)
            with open(path + ".tmp", "w") as f:
                json.dump(row, f)
            os.replace(path + ".tmp", path)

    return Progress()


def make_trainer(task: str, method: str, seed: int, lr: float, s: dict, runs_dir: str | None = None):
    """A method's trainer over a fresh LoRA team of the model (the adapters start as the identity); with `runs_dir`
    it checkpoints every SAVE_EVERY iterations there (the last checkpoint kept)."""
    import torch
    from peft import LoraConfig

    from trl_collm.tasks import get_task

    spec = get_task(task)
    saving = dict(save_strategy="steps", save_steps=SAVE_EVERY, save_total_limit=1) if runs_dir else {}
    saving["bf16"] = s.get("compute") == "bf16"  # autocast of rollout and update; the weights stay float32
    saving["use_cpu"] = not torch.cuda.is_available()  # the same command on a GPU machine trains there
    output_dir = runs_dir or f"/tmp/trl_collm_real_findings/{task}-{method}-{seed}-{lr:g}"
    args, trainer_cls = method_config(method, spec, s, lr, seed, output_dir, **saving)
    trainer = trainer_cls(
        args=args,
        model=MODEL,
        train_dataset=spec.load_dataset("train"),
        env=spec.make_env(),
        peft_config=LoraConfig(**LORA),
    )
    return trainer, args


def evaluate_start(task: str, s: dict, eval_seed: int) -> dict:
    """The starting model, played as the trained teams are: a LoRA team of it before any update (its adapters are
    the identity), through the same mixed-adapter sampling on one base and the same sampling seed, so before and
    after differ by the training alone. (The same model loaded as two plain copies samples the same distribution,
    and its greedy texts are identical, but it draws other random numbers: no paired comparison.)"""
    trainer, _ = make_trainer(task, "mc", 0, TASKS[task]["lrs"][0], s)
    return dict(evaluate(task, s, trainer.team.eval(), eval_seed), played_as="untrained LoRA team")


def run_one(
    task: str, method: str, seed: int, lr: float, s: dict, progress_path: str | None = None, runs_dir: str | None = None
) -> dict:
    """One training run in this process: the curve (env steps -> mean training return), per-level training
    curves, and the trained team's held-out scores. With `runs_dir` the run checkpoints there and, started again
    after a kill, resumes from its last checkpoint; the folder is removed once the run's result exists."""
    import shutil

    import torch
    from transformers.trainer_utils import get_last_checkpoint

    torch.set_num_threads(1)
    trainer, args = make_trainer(task, method, seed, lr, s, runs_dir)
    meta = dict(task=task, method=method, seed=seed, lr=lr, budget=s["budget"], batch=s["batch"])
    meta["response_length"], meta["compute"] = s["response_length"], s.get("compute", "fp32")
    if progress_path:
        trainer.add_callback(_progress_callback(trainer, args, progress_path, meta))
    checkpoint = get_last_checkpoint(runs_dir) if runs_dir and os.path.isdir(runs_dir) else None
    t0, c0 = time.time(), time.process_time()
    trainer.train(resume_from_checkpoint=checkpoint)
    seconds, cpu_seconds = time.time() - t0, time.process_time() - c0
    curve, levels = curves(trainer.metrics_history, args)
    team = trainer.team.eval()
    scores = evaluate(task, s, team)
    trained_here = len(curve) - (_iterations_in(checkpoint) if checkpoint else 0)
    if runs_dir:
        shutil.rmtree(runs_dir, ignore_errors=True)
    return dict(
        meta,
        env_steps=curve[-1][0],
        curve=curve,
        level_curves=levels,
        eval=scores,
        resumed_from=checkpoint and os.path.basename(checkpoint),
        seconds=seconds,
        # CPU time is what a run costs whatever the machine's load (wall time on a shared machine is not); per
        # iteration over the iterations this process trained (a resumed run's earlier ones ran elsewhere)
        cpu_seconds=cpu_seconds,
        iteration_cpu_seconds=cpu_seconds / trained_here if trained_here else None,  # None: resumed for its plays only
    )


def _iterations_in(checkpoint: str) -> int:
    """The iterations a checkpoint folder holds (transformers names it checkpoint-<global step>)."""
    return int(os.path.basename(checkpoint).rsplit("-", 1)[-1])


# ------------------------------------------------------------------------------------------- report

# (column name, eval key or function, decimals)
COLUMNS = {
    "writing-summary": [
        ("return (max 3)", "return_mean", 3),
        ("% of max", "score_pct", 1),
        ("L1 length pass", "length_pass", 2),
        ("L2 ratio pass", "ratio_pass", 2),
        ("L3 style (mean of 1)", "style_mean", 2),
        ("concise words", "concise_words", 0),
        ("detailed words", "detailed_words", 0),
    ],
    "code-humaneval": [
        ("return (max 4)", "return_mean", 3),
        ("% of max", "score_pct", 1),
        ("L1 both defined", "definitions_pass", 2),
        ("L2 parses", "syntax_pass", 2),
        ("L3 tests passed (mean)", "tests_mean", 2),
        ("all tests", "all_tests_pass", 2),
        ("bonus (uses aux)", "bonus_pass", 2),
    ],
}
COLUMNS["writing-revise"] = COLUMNS["writing-summary"]  # the same levels, of the final texts


def size_tag(s) -> str:
    """The settings that change a run's numbers (SIZE_KEYS), as run files and table files carry them in their names."""
    dtype = "" if s.get("compute", "fp32") == "fp32" else f"-{s['compute']}"  # runs of another dtype never mix
    return f"b{s['budget']}-bs{s['batch']}-t{s['response_length']}{dtype}"


def run_path(out_dir, task, method, seed, lr, s) -> str:
    """A run's file: the settings that change its numbers are in its name, so runs of other sizes never mix."""
    return os.path.join(out_dir, task, f"{method}-seed{seed}-lr{lr:g}-{size_tag(s)}.json")


def table_paths(out_dir, png_prefix, task, s) -> tuple[str, str]:
    """The table's JSON and its figure, named by the table's size too: a call at another budget or dtype (the
    2026-12-01 half-budget table, then the 128-step one) writes its own files instead of replacing another table's."""
    tag = size_tag(s)
    return os.path.join(out_dir, f"real_findings_{task}-{tag}.json"), f"{png_prefix}_{task}-{tag}_curves.png"


def partial_path(path) -> str:
    return path[: -len(".json")] + ".partial"


def start_path(out_dir, task, s, eval_seed: int = EVAL_SEED) -> str:
    """The starting model's held-out scores; at another sampling seed than the table's, a re-sample of them."""
    tail = "" if eval_seed == EVAL_SEED else f"-evalseed{eval_seed}"
    # The held-out plays' size is in the name: a start played on other rows would not pair with the runs
    plays = f"-e{s['eval_limit'] or 'all'}x{s['eval_repeats']}"
    return os.path.join(out_dir, task, f"start-t{s['response_length']}{plays}{tail}.json")


def resample_line(out_dir, task, s) -> tuple[str, list]:
    """How far the held-out scores move when only the sampling seed changes: the starting model at every eval seed
    saved (`--resample-seeds`). A trained team's change smaller than this spread is not evidence of learning."""
    rows = []
    others = start_path(out_dir, task, s, 0).replace("-evalseed0", "-evalseed*")
    paths = [start_path(out_dir, task, s)] + glob.glob(others)
    for path in (p for p in paths if os.path.exists(p)):
        with open(path) as f:
            row = json.load(f)
        rows.append(dict(row, eval_seed=row.get("eval_seed", EVAL_SEED)))
    if len(rows) < 2:
        return "", rows
    rows.sort(key=lambda r: r["eval_seed"])
    key, name = COLUMNS[task][2][1], COLUMNS[task][2][0]  # the first level's pass rate
    returns = [r["return_mean"] for r in rows]
    line = (
        f"starting model re-sampled at eval seeds {[r['eval_seed'] for r in rows]}: return "
        + ", ".join(f"{x:.3f}" for x in returns)
        + f" (range {max(returns) - min(returns):.3f}); {name} "
        + ", ".join(f"{r[key]:.2f}" for r in rows)
    )
    return line, rows


def load_runs(out_dir, task, unfinished: bool = False) -> list[dict]:
    """The finished runs (with held-out scores), or with unfinished=True the curves of runs stopped early."""
    runs = []
    for path in sorted(glob.glob(os.path.join(out_dir, task, "*-seed*" + (".partial" if unfinished else ".json")))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


SIZE_KEYS = ("budget", "batch", "response_length", "compute")


def sweep_runs(out_dir, task, s: dict, unfinished: bool = False) -> list[dict]:
    """The runs of this table's size (budget, batch, response length, compute), at every rate run so far: the data
    folder also keeps earlier tables' runs (other budgets), which must neither fill this table nor choose its rates
    (the sweep once ran CC's other seeds at a rate chosen from a run of half the budget)."""

    def same_size(r):
        return all(r.get(k, "fp32" if k == "compute" else None) == s[k] for k in SIZE_KEYS)

    return [r for r in load_runs(out_dir, task, unfinished) if same_size(r)]


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return mean, (var / n) ** 0.5


def paired_change(after: dict, before: dict) -> dict | None:
    """A trained team's held-out change against the starting model, play by play: both played the same rows at the
    same sampling seed, so each play's difference removes the rows' own difficulty from the noise. None when the two
    evaluations are not paired (other rows, another seed, or saved before per-play records existed)."""
    a, b = after.get("plays"), before.get("plays")
    if not a or not b or len(a) != len(b) or after.get("eval_seed") != before.get("eval_seed"):
        return None
    if [p["row"] for p in a] != [p["row"] for p in b]:
        return None
    ret, ret_se = _mean_se([x["total"] - y["total"] for x, y in zip(a, b)])
    lv1, lv1_se = _mean_se([float(x["level1"] >= 1.0) - float(y["level1"] >= 1.0) for x, y in zip(a, b)])
    return dict(
        plays=len(a),
        return_before=sum(y["total"] for y in b) / len(b),
        return_after=sum(x["total"] for x in a) / len(a),
        return_change=ret,
        return_se=ret_se,
        level1_before=sum(y["level1"] >= 1.0 for y in b) / len(b),
        level1_after=sum(x["level1"] >= 1.0 for x in a) / len(a),
        level1_change=lv1,
        level1_se=lv1_se,
    )


def paired_lines(runs: list[dict], start: dict, resample_rows: list[dict]) -> list[str]:
    """One line per trained run: its paired held-out change with its standard error, and whether it is beyond
    noise: more than 2 SE from zero and larger than the starting model's own re-sampling range (when measured)."""
    returns = [r["return_mean"] for r in resample_rows]
    spread = max(returns) - min(returns) if len(returns) >= 2 else None
    lines = []
    for r in sorted(runs, key=lambda r: (r["method"], r["lr"], r["seed"])):
        c = paired_change(r["eval"], start)
        if c is None:
            continue
        beyond = abs(c["return_change"]) > 2 * c["return_se"] and (spread is None or abs(c["return_change"]) > spread)
        noise = f"re-sampling range {spread:.3f}" if spread is not None else "re-sampling range not measured"
        lines.append(
            f"- {r['method'].upper()} seed {r['seed']} lr {r['lr']:g}, {r['env_steps']} env steps: return "
            f"{c['return_before']:.3f} -> {c['return_after']:.3f} (paired {c['return_change']:+.3f} +- "
            f"{c['return_se']:.3f} SE over {c['plays']} plays; {noise}: "
            f"{'beyond noise' if beyond else 'NOT beyond noise'}); level 1 {100 * c['level1_before']:.0f}% -> "
            f"{100 * c['level1_after']:.0f}% ({100 * c['level1_change']:+.0f} +- {100 * c['level1_se']:.0f} points)"
        )
    return lines


def report(task, out_dir, png_prefix, s, sweep_seed) -> str:
    """The table (Markdown) from the runs saved so far, labelled with how complete each cell is; writes the JSON
    and the learning-curve figure.

    It covers every method of the task's target and of `s`, whatever this call trains (`--methods mc` runs one cell;
    the JSON and the figure it rewrites stay the whole table)."""
    s = dict(s, methods=tuple(dict.fromkeys([*TASKS[task]["methods"], *s["methods"]])))
    path = start_path(out_dir, task, s)
    start = json.load(open(path)) if os.path.exists(path) else None
    runs = sweep_runs(out_dir, task, s)
    stopped = sweep_runs(out_dir, task, s, unfinished=True)
    chosen = choose_rates(runs, s["methods"], sweep_seed)
    mine = [r for r in runs if r["lr"] == chosen.get(r["method"])]
    lines = [f"## {task}: {s['describe']}", "", f"training compute: {s['compute']} (held-out plays: float32)"]
    if start:
        played = start.get("played_as", "the model loaded as plain copies")
        lines.append(f"starting model ({played}): {start['prompt_form']} prompts, {start['episodes']} held-out plays")
    resampled, resample_rows = resample_line(out_dir, task, s)
    if resampled:
        lines.append(resampled)
    forms = sorted({r["eval"]["prompt_form"] for r in runs})
    lines.append(f"trained runs' prompts: {', '.join(forms) or '-'}")
    # Completeness against the target (TASKS), not against this call's --budget / --seeds: a cut budget
    # is reported as a cut.
    target = TASKS[task]
    cells, partial_any = [], False
    for m in s["methods"]:
        got = [r for r in mine if r["method"] == m]
        cut = [f"seed {r['seed']} lr {r['lr']:g} at {r['env_steps']}" for r in stopped if r["method"] == m]
        cut = f"; unfinished (training curve so far, no held-out scores): {', '.join(cut)}" if cut else ""
        if not got:
            cells.append(f"{m.upper()}: no finished run - MISSING{cut}")
            partial_any = True
            continue
        steps = sorted({r["env_steps"] for r in got})
        rates = sorted({r["lr"] for r in runs if r["method"] == m})
        partial = len(got) < len(target["seeds"]) or min(steps) < target["budget"] or len(rates) < len(target["lrs"])
        partial_any = partial_any or partial
        cells.append(
            f"{m.upper()}: lr {chosen[m]:g} chosen of {rates} (target {list(target['lrs'])}), "
            f"{len(got)}/{len(target['seeds'])} seeds, {steps} env steps (target {target['budget']})"
            + (" - PARTIAL" if partial else "")
            + cut
        )
    lines += ["", *(f"- {c}" for c in cells), ""]
    drift = training_drift(mine, s["methods"])
    if drift:
        lines += [drift, ""]
    paired = paired_lines(runs, start, resample_rows) if start else []
    if paired:
        lines += ["held-out change against the starting model, play by play (every finished run):", *paired, ""]
    blob = dict(task=task, settings=s, start=start, chosen=chosen, runs=runs, stopped_early=stopped)
    blob["start_resampled"] = resample_rows
    json_path, png_path = table_paths(out_dir, png_prefix, task, s)
    if (mine or stopped) and start:
        try:
            plot_curves(mine, stopped, task, png_path, start["return_mean"], s)
            if mine:
                plot_heldout(mine, task, heldout_path(png_prefix, task, s), start, resample_rows, s)
        except ImportError:
            pass
    if mine and start:
        t = table(mine, task, start, COLUMNS[task])
        blob["table"] = t
        extra = ("paper TLDR %", lambda m: f"{PAPER_TLDR.get(m, '-')}") if task == "writing-summary" else None
        lines.append("(each trained cell: mean over seeds (SD over seeds; min to max); the return also its SD)")
        lines.append(format_table(t, COLUMNS[task], start_name="starting model", extra=extra, sd_columns=1))
        diff_lines, blob["differences"] = difference_lines(mine, start, s["methods"])
        if diff_lines and partial_any:
            diff_lines[0] = "PARTIAL table, intervals from the runs finished so far; " + diff_lines[0]
        lines += ["", *diff_lines] if diff_lines else []
    os.makedirs(out_dir, exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(blob, f, indent=1)
    return "\n".join(lines)


def training_drift(runs, methods, k: int = 2) -> str:
    """Each method's training return in its first k and last k iterations (mean over its runs): what the training
    rollouts say moved, beside the held-out plays (the first k and the last k draw different prompts, so this is
    a trend, not a paired measure)."""
    parts = []
    for m in methods:
        curves_m = [[v for _, v in r["curve"]] for r in runs if r["method"] == m and len(r["curve"]) >= 2 * k]
        if curves_m:
            first = sum(sum(c[:k]) / k for c in curves_m) / len(curves_m)
            last = sum(sum(c[-k:]) / k for c in curves_m) / len(curves_m)
            ups = sum(sum(c[-k:]) > sum(c[:k]) for c in curves_m)
            parts.append(f"{m.upper()} {first:.3f} -> {last:.3f} (up in {ups}/{len(curves_m)} runs)")
    return f"training return, first {k} -> last {k} iterations: " + "; ".join(parts) if parts else ""


def plot_curves(runs, stopped, task, path, start_return, s):
    """Each method's finished runs (mean and band over seeds); a method with none: its unfinished runs, so
    labelled unfinished."""
    with saved_figure(
        path,
        (6.5, 4.0),
        f"{task}: training rollouts, SmolLM2-135M LoRA teams\nline: mean over seeds; band: min to max over seeds",
        "environment steps",
        "training return (moving mean of 5)",
    ) as ax:
        for m in s["methods"]:
            got = [r for r in runs if r["method"] == m]
            early = not got
            got = got or [r for r in stopped if r["method"] == m]
            if got:
                plot_seed_band(ax, got, m)
                if early:
                    line = ax.get_lines()[-1]
                    line.set_linestyle("--")
                    line.set_label(line.get_label() + ", unfinished")
        ax.axhline(start_return, color="grey", ls="--", lw=1, label="starting model (held-out eval)")


def heldout_path(png_prefix, task, s) -> str:
    """The held-out figure, named by the table's size as `table_paths` names the curves."""
    return f"{png_prefix}_{task}-{size_tag(s)}_heldout.png"


def plot_heldout(runs, task, path, start, resample_rows, s):
    """The held-out return of every finished run (a dot per seed, its bar +- 2 SE of the paired change over plays),
    each method's mean over seeds (a bar), and the starting model (its line; its band: the range over the sampling
    seeds it was played at)."""
    with saved_figure(
        path,
        (6.5, 4.0),
        f"{task}, held-out return ({start['episodes']} plays each, sampling seed {start.get('eval_seed', EVAL_SEED)})\n"
        "dot: one seed, bar +- 2 SE over plays (paired); line: mean over seeds",
        "method (learning rate)",
        "held-out return",
    ) as ax:
        returns = [r["return_mean"] for r in resample_rows] or [start["return_mean"]]
        ax.axhspan(min(returns), max(returns), color="grey", alpha=0.2, lw=0)
        ax.axhline(start["return_mean"], color="grey", ls="--", lw=1, label="starting model (band: re-sampling range)")
        names = []
        for x, m in enumerate(m for m in s["methods"] if any(r["method"] == m for r in runs)):
            got = sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"])
            for k, r in enumerate(got):
                changes = play_changes(r["eval"], start)
                se = None
                if changes and len(changes) > 1:
                    mean = sum(changes) / len(changes)
                    se = (sum((c - mean) ** 2 for c in changes) / (len(changes) - 1) / len(changes)) ** 0.5
                xk = x + 0.12 * (k - (len(got) - 1) / 2)
                ax.errorbar(
                    xk,
                    r["eval"]["return_mean"],
                    yerr=None if se is None else 2 * se,
                    fmt="o",
                    ms=4,
                    color=COLOURS[m],
                    capsize=2,
                    label=f"{m.upper()} ({len(got)} seeds)" if k == 0 else None,
                )
            mean = sum(r["eval"]["return_mean"] for r in got) / len(got)
            ax.hlines(mean, x - 0.3, x + 0.3, color=COLOURS[m], lw=2)
            names.append(f"{m.upper()} ({got[0]['lr']:g})")
        ax.set_xticks(range(len(names)), names)


# ------------------------------------------------------------------------------------------- driver


def child(task, what, seed, lr, s, out_dir, runs_root=RUNS_DIR):
    """Runs in its own process (one CPU thread): the starting model's evaluation or one training run."""
    import torch

    torch.set_num_threads(1)
    if what == "start":  # `seed` is the sampling seed of the held-out plays here
        row = dict(evaluate_start(task, s, eval_seed=seed), model=MODEL)
        path = start_path(out_dir, task, s, seed)
    else:
        path = run_path(out_dir, task, what, seed, lr, s)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        name = os.path.basename(path)[: -len(".json")]
        row = run_one(
            task, what, seed, lr, s, progress_path=partial_path(path), runs_dir=os.path.join(runs_root, task, name)
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(row, f)
    os.replace(path + ".tmp", path)  # a run file exists only once complete
    if os.path.exists(partial_path(path)):
        os.remove(partial_path(path))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=list(TASKS))
    p.add_argument("--methods", nargs="+", default=None, choices=("cc", "dc", "mc"))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--lrs", nargs="+", type=float, default=None, help="learning rates swept (every method alike)")
    p.add_argument("--sweep-seed", type=int, default=0, help="the seed every rate runs on; the others use the best")
    p.add_argument("--budget", type=int, default=None, help="env steps per run (default per task)")
    p.add_argument("--batch", type=int, default=None, help="episodes (PPO) or samples (MC) per iteration")
    p.add_argument(
        "--resample-seeds",
        nargs="+",
        type=int,
        default=[],
        help=f"also play the starting model at these sampling seeds (the table's is {EVAL_SEED}): the held-out noise",
    )
    p.add_argument(
        "--compute",
        default="auto",
        choices=("auto", "fp32", "bf16"),
        help="training dtype: auto = bf16 autocast where the CPU has native bf16 (float32 master weights), else fp32",
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes, one CPU thread each)")
    p.add_argument("--out-dir", default=None, help="default docs/data/real_findings (/tmp/real_findings_smoke)")
    p.add_argument("--png-prefix", default=None, help="default docs/real_findings")
    p.add_argument("--smoke", action="store_true", help="1 seed, 1 rate, 8 env steps, 8 tokens, 2 eval rows")
    p.add_argument("--report-only", action="store_true", help="no new runs: the table from the runs saved so far")
    p.add_argument("--child", nargs=3, metavar=("WHAT", "SEED", "LR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    s = settings(a.task, a.smoke, a.budget, a.batch, a.compute)
    for key in ("methods", "seeds", "lrs"):
        if getattr(a, key):
            s[key] = tuple(getattr(a, key))
    if a.sweep_seed not in s["seeds"]:
        p.error(f"--sweep-seed {a.sweep_seed} is not one of --seeds {list(s['seeds'])}")
    out_dir = a.out_dir or ("/tmp/real_findings_smoke" if a.smoke else "docs/data/real_findings")
    png_prefix = a.png_prefix or ("/tmp/real_findings_smoke" if a.smoke else "docs/real_findings")
    if a.child:
        what, seed, lr = a.child
        runs_root = os.path.join(out_dir, "runs") if a.smoke else RUNS_DIR
        child(a.task, what, int(seed), float(lr), s, out_dir, runs_root)
        return

    def launch(job):
        what, seed, lr = job
        path = start_path(out_dir, a.task, s, seed) if what == "start" else run_path(out_dir, a.task, what, seed, lr, s)
        if os.path.exists(path) or a.report_only:
            return
        cmd = [sys.executable, os.path.abspath(__file__), a.task, "--child", what, str(seed), repr(lr)]
        cmd += ["--out-dir", out_dir, "--budget", str(s["budget"]), "--batch", str(s["batch"])]
        cmd += ["--compute", s["compute"]]
        cmd += ["--smoke"] if a.smoke else []
        # The run's output goes to a file, not a pipe to this driver: a run outlives a stopped driver (a pipe
        # with no reader kills the run at its next progress line, after an hour of training) and leaves its log.
        log = path[: -len(".json")] + ".log"  # kept (git-ignored) only when the run fails
        os.makedirs(os.path.dirname(log), exist_ok=True)
        t0 = time.time()
        with open(log, "w") as f:
            code = subprocess.run(
                cmd, check=False, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")
            ).returncode
        if code != 0:
            with open(log) as f:
                print(f"  {what} seed {seed} lr {lr:g} FAILED (log: {log}):\n{f.read()[-3000:]}", flush=True)
            return
        os.remove(log)
        print(f"  {a.task} {what} seed {seed} lr {lr:g}: done ({time.time() - t0:.0f}s)", flush=True)

    # 1) the starting model and the sweep seed at every rate (methods interleaved so load drifts hit them alike)
    first = [("start", seed, 0.0) for seed in dict.fromkeys([EVAL_SEED, *a.resample_seeds])]
    first += [(m, a.sweep_seed, lr) for lr in s["lrs"] for m in s["methods"]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(launch, first))
    # 2) the other seeds at each method's chosen rate
    chosen = choose_rates(sweep_runs(out_dir, a.task, s), s["methods"], a.sweep_seed)
    for m in s["methods"]:
        if m not in chosen and not a.report_only:  # its sweep-seed runs failed (their logs say why): no rate yet
            print(f"  {m}: no finished run on the sweep seed {a.sweep_seed}; its other seeds wait for one", flush=True)
    rest = [(m, seed, chosen[m]) for seed in s["seeds"] if seed != a.sweep_seed for m in chosen]
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(launch, rest))
    print(report(a.task, out_dir, png_prefix, s, a.sweep_seed), flush=True)


if __name__ == "__main__":
    main()
