"""CPU cost of one real-model team iteration, side by side across code trees and compute dtypes.

The workload (issue 28's): writing-summary, a LoRA team of SmolLM2-135M-Instruct (r=8 on q_proj / v_proj, one
adapter per agent plus the critic's adapter and head for CC / DC), 8 chat episodes (MC: 2 posts x 4 samples) per
iteration, both agents forced to 64 new tokens (the stop id is outside the vocabulary), one torch thread, PPO as the
table runs it (1 epoch, no KL). Per measurement it prints CPU milliseconds per generated token of the whole
iteration, of its rollout, scoring and update, and of a bare `generate()` of the same adapters on the same prompts
at the same batch; and this machine's matmul roofline (GFLOP/s, float32 and bf16) with its CPU flags. With
`--count-flops`, one more (untimed) iteration counts each phase's FLOPs, and the table adds the floor: the CPU ms per
token of that arithmetic at the roofline's rate.

Rounds alternate the measured (tree, compute, micro-batch) cases, each in a fresh process, so that a change of the
machine's load hits them alike; the table gives medians over rounds and each case's ratio to the first one. CPU
seconds (not wall) are the measure: with one thread they are what an idle run would take, whatever else runs.

    python benchmarks/speed/bench_workload.py --workload cc --compute fp32 bf16            # this tree, two dtypes
    python benchmarks/speed/bench_workload.py --against /path/to/old/checkout --rounds 3   # this tree vs another one
    python benchmarks/speed/bench_workload.py --against /path/to/old/checkout --count-flops  # + FLOPs and their floor
    python benchmarks/speed/bench_workload.py --compute fp32 --activation-checkpointing   # the memory / compute trade
    python benchmarks/speed/bench_workload.py --compute bf16 --micro-batch 8 4 2           # the update in micro-batches
    python benchmarks/speed/bench_workload.py --set reuse_value_forward=false            # any config field, every case
    python benchmarks/speed/bench_workload.py --smoke                                      # 2 episodes, 4 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout: benchmarks/speed/ is two levels down


def _model_path() -> str:
    try:
        from trl_collm.team.pretrained import smollm2_135m_instruct
    except ImportError:  # a tree from before the package move (trl_collm.models)
        from trl_collm.models import smollm2_135m_instruct
    return smollm2_135m_instruct()


def workload_trainer(
    workload: str,
    batch: int,
    tokens: int,
    bf16: bool,
    out_dir: str,
    checkpointing: bool = False,
    micro: int = 0,
    overrides: dict | None = None,
):
    """The workload's trainer, configured by warm_findings.method_config (the tables' own settings: PPO 1 epoch, no
    KL; MC G = 4), with the benchmark's overrides: its dtype, a stop id outside the vocabulary, activation
    checkpointing when asked (memory for compute; it also turns off the kept prompt prefill), and PPO's update in
    micro-batches of `micro` episodes (`per_device_train_batch_size` = micro, `gradient_accumulation_steps` = batch /
    micro: the same episodes and the same update up to float rounding, less memory; the iteration plan then keeps no
    graph from sampling to the update), then `overrides` (config field -> value, e.g. an iteration-plan switch)."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_collm.tasks import get_task

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "research"))
    from warm_findings import method_config

    task = get_task("writing-summary")
    path = _model_path()
    budget = dict(budget=100 * batch, batch=batch, response_length=tokens)
    args, cls = method_config(
        workload,
        task,
        budget,
        lr=1e-3,
        seed=0,
        output_dir=out_dir,
        bf16=bf16,
        stop_token_id=len(AutoTokenizer.from_pretrained(path)),  # never sampled: every text runs to `tokens`
        **({"activation_checkpointing": True} if checkpointing else {}),
    )
    if micro and micro != batch:
        if workload == "mc" or batch % micro:
            raise SystemExit(f"--micro-batch {micro}: PPO workloads only (cc, dc), a divisor of --batch {batch}")
        args.per_device_train_batch_size, args.gradient_accumulation_steps = micro, batch // micro
    for field, value in (overrides or {}).items():
        if not hasattr(args, field):
            raise SystemExit(f"--set {field}=...: {type(args).__name__} has no field {field!r}")
        setattr(args, field, value)
    trainer = cls(
        args=args,
        model=path,
        train_dataset=task.load_dataset("train"),
        env=task.make_env(),
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    trainer._batch_sizes()
    trainer.create_optimizer_and_scheduler(num_training_steps=100 * trainer.optimizer_steps_per_iteration())
    return trainer, list(task.load_dataset("train"))


def _bare_generate(trainer, roll, tokens: int) -> tuple[float, int]:
    """CPU seconds and new tokens of generate() per agent, on the rollout's first-turn prompts, same batch."""
    import torch

    team, c0, made = trainer.team, time.process_time(), 0
    for a in roll.agent_names:
        gen = roll.turns[0][a].gen
        with team.active(a) as model, torch.no_grad():
            out = model.generate(
                input_ids=gen.query_ids,
                attention_mask=gen.query_mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=True,
                pad_token_id=team.pad_id(a),
            )
        made += out[:, gen.query_ids.shape[1] :].numel()
    return time.process_time() - c0, made


def child(opts) -> dict:
    """One measurement in this process (the tree on PYTHONPATH): warm-up iterations, then timed ones."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    from bench_iteration import PHASE_METHODS, PhaseTimer, flop_counter, generated_tokens, peak_rss_mib

    (compute,) = opts.compute  # the parent passes one; `--compute` is a list (a list never equals "bf16")
    bf16 = compute == "bf16"
    with tempfile.TemporaryDirectory(prefix="bench-workload-") as out_dir:
        trainer, rows = workload_trainer(
            opts.workload,
            opts.batch,
            opts.response_length,
            bf16,
            out_dir,
            opts.activation_checkpointing,
            opts.micro,
            dict(_parse_set(x) for x in opts.set),
        )
        timer = PhaseTimer(trainer, "cpu")
        layer_params = timer.count_weight_passes(trainer.team)
        weight_bytes = layer_params * (2 if bf16 else 4)  # bf16 runs read the frozen base's bf16 copies
        autocast_seen = set()  # what the update really ran under: the measurement's label is checked against it
        update_method = next(m for m in PHASE_METHODS["update"] if hasattr(trainer, m))  # PPO: update, MC: run_updates
        update = getattr(trainer, update_method)

        def update_seen(*args, **kwargs):
            on = torch.is_autocast_enabled("cpu")
            autocast_seen.add(str(torch.get_autocast_dtype("cpu")).replace("torch.", "") if on else "off")
            return update(*args, **kwargs)

        setattr(trainer, update_method, update_seen)
        per_iter = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        results = []
        for i in range(opts.warmup + opts.iterations):
            timer.reset()
            batch_rows = rows[i * per_iter : (i + 1) * per_iter]
            c0 = time.process_time()
            with trainer.accelerator.autocast():  # as train() runs each iteration: bf16 autocast when bf16=True
                trainer.training_iteration(batch_rows)
            total = time.process_time() - c0
            roll = timer.last_rollout
            made = generated_tokens(roll)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                gen_cpu, gen_tokens = _bare_generate(trainer, roll, opts.response_length)
            if i >= opts.warmup:
                moved = {k: n * weight_bytes for k, n in timer.passes.items()}
                results.append(
                    dict(
                        total=total, tokens=made, gen_cpu=gen_cpu, gen_tokens=gen_tokens, bytes=moved, **timer.cpu_times
                    )
                )
        gflop = None
        if opts.count_flops:  # one more iteration, counted and not timed: the counter's Python slows every op
            i, timer.counter = i + 1, flop_counter()
            timer.reset()
            with timer.counter, trainer.accelerator.autocast():
                trainer.training_iteration(rows[i * per_iter : (i + 1) * per_iter])
                roll = timer.last_rollout
                made, total_flops = generated_tokens(roll), timer.counter.get_total_flops()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    _, gen_tokens = _bare_generate(trainer, roll, opts.response_length)
                gen_flops = timer.counter.get_total_flops() - total_flops
            gflop = {k: timer.flops.get(k, 0) / made / 1e9 for k in PHASES if k != "total"}
            gflop.update(total=total_flops / made / 1e9, generate=gen_flops / gen_tokens / 1e9)
    ms = {k: statistics.median(1000 * r.get(k, 0.0) / r["tokens"] for r in results) for k in PHASES}
    ms["generate"] = statistics.median(1000 * r["gen_cpu"] / r["gen_tokens"] for r in results)
    mb = {
        k: statistics.median(r["bytes"].get(k, 0) / r["tokens"] / 1e6 for r in results) for k in PHASES if k != "total"
    }
    mb["total"] = sum(mb.values())
    import trl_collm

    return dict(
        package=os.path.dirname(os.path.abspath(trl_collm.__file__)),  # the tree that really ran
        ms_per_token=ms,
        weight_mb_per_token=mb,
        gflop_per_token=gflop,
        tokens=results[0]["tokens"],
        autocast=sorted(autocast_seen),
        # what the models run with (transformers sets `gradient_checkpointing` on the layer stacks), not the config
        activation_checkpointing=any(
            getattr(m, "gradient_checkpointing", False) is True for m in trainer.team.modules()
        ),
        peak_rss_mib=peak_rss_mib(),
    )


PHASES = ("total", "rollout", "score_rollout", "update")


def phase_floors(gflop: dict, weight_mb: dict, gflops: float, bandwidth: float) -> dict:
    """Per phase (rollout, score_rollout, update), the CPU ms per token of the larger of its arithmetic at `gflops`
    and its weight bytes at `bandwidth` GB/s, with which one bounds it (`<phase>_bound`: "flops" or "bytes");
    `total` is the phases' sum."""
    out = {}
    for phase in ("rollout", "score_rollout", "update"):
        compute_ms = 1000 * gflop.get(phase, 0.0) / gflops
        memory_ms = weight_mb.get(phase, 0.0) / bandwidth  # MB / (GB/s) = ms
        out[phase] = max(compute_ms, memory_ms)
        out[phase + "_bound"] = "bytes" if memory_ms > compute_ms else "flops"
    out["total"] = out["rollout"] + out["score_rollout"] + out["update"]
    return out


def _parse_set(text: str) -> tuple[str, object]:
    """`field=value` of --set: the value read as JSON (true, 2, 0.5, "x"), else as the string itself."""
    field, sep, value = text.partition("=")
    if not sep or not field:
        raise SystemExit(f"--set {text!r}: write field=value, e.g. --set reuse_value_forward=false")
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def _micro_label(micro: int) -> str:
    return f" micro-batch {micro}" if micro else ""


def roofline() -> tuple[str, dict[str, float]]:
    """This machine's flags and its one-thread 1024 x 1024 matmul rate per compute dtype (GFLOP per CPU-second)."""
    import torch

    torch.set_num_threads(1)
    from trl_collm.hardware import cpu_description, matmul_gflops, memory_gbs

    rate = dict(fp32=matmul_gflops(torch.float32), bf16=matmul_gflops(torch.bfloat16), memory=memory_gbs())
    text = f"{cpu_description()}; one thread, 1024x1024 matmul: float32 {rate['fp32']:.0f} GFLOP/s, "
    text += f"bf16 {rate['bf16']:.0f} GFLOP/s; memory {rate['memory']:.1f} GB/s (a 256 MiB copy)"
    return text, rate


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("cc", "dc", "mc"), default="cc")
    p.add_argument("--compute", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--against", nargs="*", default=[], help="other checkouts measured beside this one")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (fresh processes)")
    p.add_argument("--batch", type=int, default=8, help="episodes per iteration (MC: samples)")
    p.add_argument("--response-length", type=int, default=64)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--count-flops",
        action="store_true",
        help="also count each phase's FLOPs (one more iteration in the first round, not timed) and print the CPU ms "
        "per token they take at this machine's matmul rate: the floor of that arithmetic",
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="train with activation checkpointing (less memory, more compute; the peak is in the table)",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        nargs="+",
        default=[0],
        dest="micro_batches",
        help="PPO workloads: also measure the update in micro-batches of these many episodes (0 or --batch: one)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="config fields for every case, e.g. reuse_value_forward=false reuse_rollout_prefill=false (the graphs "
        "the iteration plan keeps from sampling to the update)",
    )
    p.add_argument("--smoke", action="store_true", help="2 episodes (MC: 4 samples), 4 tokens, 1 round")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--micro", type=int, default=0, help=argparse.SUPPRESS)  # the child's one micro-batch
    opts = p.parse_args()
    if opts.smoke:
        opts.batch, opts.response_length, opts.rounds = (4 if opts.workload == "mc" else 2), 4, 1
        opts.warmup, opts.compute = 0, opts.compute[:1]
    if opts.child:
        print("RESULT " + json.dumps(child(opts)), flush=True)
        return
    trees = [ROOT, *[os.path.abspath(t) for t in opts.against]]
    pairs = [(t, c, m) for t in trees for c in opts.compute for m in opts.micro_batches]
    roof_text, rate = roofline()
    bandwidth = rate["memory"]
    print(roof_text, flush=True)
    got: dict = {pair: [] for pair in pairs}
    for r in range(opts.rounds):
        for pair in pairs if r % 2 == 0 else pairs[::-1]:  # alternate the order too
            tree, compute, micro = pair
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--workload", opts.workload]
            cmd += ["--compute", compute, "--batch", str(opts.batch), "--response-length", str(opts.response_length)]
            cmd += ["--iterations", str(opts.iterations), "--warmup", str(opts.warmup), "--micro", str(micro)]
            cmd += ["--set", *opts.set] if opts.set else []
            cmd += ["--count-flops"] if opts.count_flops and r == 0 else []
            cmd += ["--activation-checkpointing"] if opts.activation_checkpointing else []
            env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"measurement failed in {tree} ({compute}), exit code {out.returncode}:\n{out.stderr[-3000:]}")
            result = json.loads(line[len("RESULT ") :])
            if os.path.dirname(result["package"]) != tree:  # e.g. an installed copy instead of the tree's own
                sys.exit(f"the measurement labelled {tree} imported trl_collm from {result['package']}")
            expected = ["bfloat16"] if compute == "bf16" else ["off"]
            if result.get("autocast") != expected:  # a label that does not say what ran is worse than no figure
                sys.exit(f"the {compute} measurement in {tree} updated under autocast {result.get('autocast')}")
            if result.get("activation_checkpointing") != opts.activation_checkpointing:
                sys.exit(
                    f"the measurement in {tree} ran with activation_checkpointing="
                    f"{result.get('activation_checkpointing')}, not {opts.activation_checkpointing}"
                )
            got[pair].append(result)
            ms = got[pair][-1]["ms_per_token"]
            print(
                f"round {r + 1}: {tree} {compute}{_micro_label(micro)}: {ms['total']:.1f} CPU ms per generated token, "
                f"peak {result['peak_rss_mib']:,.0f} MiB",
                flush=True,
            )
    rows = []
    for pair in pairs:
        tree, compute, micro = pair
        med = {k: statistics.median(g["ms_per_token"][k] for g in got[pair]) for k in (*PHASES, "generate")}
        rows.append(
            dict(
                tree=tree,
                compute=compute,
                micro_batch=micro or opts.batch,
                autocast=got[pair][0]["autocast"],
                activation_checkpointing=opts.activation_checkpointing,
                ms_per_token=med,
                rounds=len(got[pair]),
                peak_rss_mib=max(g.get("peak_rss_mib", 0.0) for g in got[pair]),
            )
        )
        gflop = got[pair][0].get("gflop_per_token")
        if gflop:  # the floor: that arithmetic at the 1024 x 1024 matmul's rate, every FLOP as fast as the best GEMM
            mb = got[pair][0].get("weight_mb_per_token") or {}
            rows[-1].update(
                gflop_per_token=gflop,
                weight_mb_per_token=mb,
                floor_ms_per_token=phase_floors(gflop, mb, rate[compute], bandwidth),
            )
    base = rows[0]["ms_per_token"]["total"]
    print(
        f"\n{opts.workload.upper()} workload: batch {opts.batch}, {opts.response_length} tokens, one thread"
        f"{', activation checkpointing' if opts.activation_checkpointing else ''}"
        f"{''.join(', ' + x for x in opts.set)}; "
        "CPU ms per generated token (median over rounds)"
    )
    print(
        f"{'tree':<28} {'compute':<7} {'micro':>5} {'iteration':>9} {'rollout':>8} {'score':>7} {'update':>7} "
        f"{'bare gen':>8} {'speed-up':>8} {'peak MiB':>8}"
    )
    for r in rows:
        m = r["ms_per_token"]
        print(
            f"{os.path.basename(r['tree']) or r['tree']:<28} {r['compute']:<7} {r['micro_batch']:>5} "
            f"{m['total']:>9.1f} {m['rollout']:>8.1f} "
            f"{m['score_rollout']:>7.1f} {m['update']:>7.1f} {m['generate']:>8.1f} {base / m['total']:>7.2f}x "
            f"{r['peak_rss_mib']:>8,.0f}"
        )
    if opts.count_flops:
        print(
            "\nThe floor per phase, a roofline: the larger of its arithmetic (torch's FlopCounterMode over one more "
            f"iteration) at this machine's 1024x1024 matmul rate and the weights it reads (decoder layers, once per "
            f"forward, twice with gradients) at {bandwidth:.1f} GB/s; per generated token; the bound in brackets"
        )
        print(
            f"{'tree':<28} {'compute':<7} {'micro':>5} {'GFLOP':>6} {'weight MB':>9} {'rollout floor':>16} "
            f"{'scoring floor':>16} {'update floor':>16} {'floor ms':>8} {'measured/floor':>14}"
        )
        for r in rows:
            g, mb, floors = r["gflop_per_token"], r.get("weight_mb_per_token", {}), r["floor_ms_per_token"]
            cells = [  # a phase without arithmetic (MC's scoring, or values deferred to the update) has no ratio
                f"{f:.1f} ({floors[k + '_bound']}) x{r['ms_per_token'][k] / f:.1f}" if f else "-"
                for k in ("rollout", "score_rollout", "update")
                for f in [floors[k]]
            ]
            print(
                f"{os.path.basename(r['tree']) or r['tree']:<28} {r['compute']:<7} {r['micro_batch']:>5} "
                f"{g['total']:>6.2f} {mb.get('total', 0.0):>9.1f} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} "
                f"{floors['total']:>8.1f} {r['ms_per_token']['total'] / floors['total']:>13.2f}x"
            )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(dict(options=vars(opts), rows=rows, roofline=roof_text, matmul_gflops=rate), f, indent=1)


if __name__ == "__main__":
    main()
