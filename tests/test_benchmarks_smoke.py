"""Seconds-long smoke runs of the benchmark scripts, so they keep working. They check that each script runs end to
end and writes well-formed results, not any speed (benchmarks report figures; tests do not time things)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hang_guard import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(args, tmp_path, timeout=HANG_GUARD_S):
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TRL_COLLM_CACHE=str(tmp_path / "models"),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_bench_iteration_smoke(tmp_path):
    path = tmp_path / "iteration.json"
    stdout = run_script(["benchmarks/speed/bench_iteration.py", "--smoke", "--json", str(path)], tmp_path)
    rows = json.loads(path.read_text())
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert rows and all(r["iteration_s"] > 0 and r["generate_s"] > 0 for r in rows)
    assert "ratio" in stdout


def test_bench_memory_smoke(tmp_path):
    path = tmp_path / "memory.json"
    stdout = run_script(["benchmarks/speed/bench_memory.py", "--smoke", "--json", str(path)], tmp_path)
    rows = json.loads(path.read_text())
    assert {(r["layout"], r["agents"]) for r in rows} == {("separate", 1), ("separate", 2), ("lora", 1), ("lora", 2)}
    for r in rows:
        assert r["peak_rss_mib"] >= r["baseline_rss_mib"] > 0
    sep = {r["agents"]: r["trainable_params"] for r in rows if r["layout"] == "separate"}
    lora = {r["agents"]: r["trainable_params"] for r in rows if r["layout"] == "lora"}
    assert sep[2] > sep[1] > lora[2] > lora[1] > 0  # a second full agent vs a second adapter
    assert "goal (lora)" in stdout


def test_bench_iteration_lora_smoke(tmp_path):
    """--lora: the agents are adapters on one base; bare generate() runs each adapter, CPU seconds are reported."""
    path = tmp_path / "iteration.json"
    run_script(
        ["benchmarks/speed/bench_iteration.py", "--smoke", "--lora", "--configs", "collm", "--json", str(path)],
        tmp_path,
    )
    (row,) = json.loads(path.read_text())["results"]
    assert row["iteration_cpu_s"] > 0 and row["generate_cpu_s"] > 0 and row["bare_generate_tokens"] > 0


def test_bench_memory_logprobs_smoke(tmp_path):
    path = tmp_path / "logprobs.json"
    args = ["benchmarks/speed/bench_memory.py", "--logprobs", "--size", "tiny", "--batch", "2"]
    args += ["--response-length", "4"]
    stdout = run_script([*args, "--json", str(path)], tmp_path)
    library, full = json.loads(path.read_text())
    assert (library["variant"], full["variant"]) == ("library", "full-softmax")
    assert library["entropy"] == pytest.approx(full["entropy"], rel=1e-4)  # the same numbers, two ways
    assert library["peak_above_mib"] >= 0 and "x logits" in stdout


def test_paper_findings_smoke_and_reuse(tmp_path):
    out = tmp_path / "findings.json"
    args = [
        "benchmarks/research/paper_findings.py",
        "--smoke",
        "--tasks",
        "coord-penalty",
        "--out",
        str(out),
        "--png-prefix",
        str(tmp_path / "fig"),
        "--lrs",
        "1e-2",
        "3e-2",
        "--methods",
        "cc",
        "mc",
        "--jobs",
        "2",
    ]
    stdout = run_script(args, tmp_path)
    runs = json.loads(out.read_text())
    assert sorted((r["method"], r["lr"]) for r in runs) == [("cc", 0.01), ("cc", 0.03), ("mc", 0.01), ("mc", 0.03)]
    assert all(r["curve"] and r["curve"][-1][0] > 0 for r in runs)
    assert "each method at its best learning rate" in stdout
    for suffix in ("", "_tuned", "_lr"):  # curves at the equal rate, at each method's best rate, final return vs rate
        assert (tmp_path / f"fig_coord-penalty{suffix}.png").stat().st_size > 1000
    # --reuse finds every run already done and runs nothing.
    again = run_script(args + ["--reuse"], tmp_path)
    assert "0 runs to do (4 other runs kept" in again
    assert len(json.loads(out.read_text())) == 4
    # Without --reuse the planned run is run again and replaced; the file's other runs stay.
    args = args[: args.index("--lrs")] + ["--lrs", "1e-2", "--methods", "cc"]
    rerun = run_script(args, tmp_path)
    assert "1 runs to do (3 other runs kept" in rerun
    assert sorted((r["method"], r["lr"]) for r in json.loads(out.read_text())) == [
        ("cc", 0.01),
        ("cc", 0.03),
        ("mc", 0.01),
        ("mc", 0.03),
    ]


def test_batching_ceiling_smoke(tmp_path):
    stdout = run_script(
        [
            "benchmarks/compare/vs_comlrl/batching_ceiling.py",
            "--sizes",
            "tiny",
            "--reps",
            "1",
            "--batch",
            "2",
            "--prompt-len",
            "8",
            "--view-len",
            "12",
            "--models-dir",
            str(tmp_path / "m"),
        ],
        tmp_path,
    )
    row = json.loads(stdout.strip().splitlines()[-1])["rows"][0]
    for key in ("generate", "logprob_fwd_bwd", "critic_fwd_bwd"):
        assert row[key]["batched_s"] > 0 and row[key]["one_by_one_s"] > 0


def test_paper_findings_rejects_bad_jobs(tmp_path):
    out = subprocess.run(
        [sys.executable, "benchmarks/research/paper_findings.py", "--jobs", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert out.returncode == 2 and "--jobs must be at least 1" in out.stderr


pytestmark = pytest.mark.timeout(HANG_GUARD_S)


def test_bench_prefix_smoke(tmp_path):
    path = tmp_path / "prefix.json"
    stdout = run_script(["benchmarks/speed/bench_prefix.py", "--smoke", "--json", str(path)], tmp_path)
    rows = json.loads(path.read_text())["results"]
    assert {r["case"] for r in rows} == {"coord-penalty/cc", "writing-summary/mc"}
    for r in rows:
        assert r["shared"]["iteration_s"] > 0 and r["plain"]["iteration_s"] > 0
        # The cut only runs when on, and only where the cost model says it pays (prefix.min_saved_tokens: on the
        # tiny smoke models it may decline); tests/test_prefix.py covers the cut's numbers and that choice.
        assert r["plain"]["saved"] == 0 <= r["shared"]["saved"] < r["shared"]["tokens"]
    assert "forward tokens skipped" in stdout


def test_the_flop_counter_counts_cpu_attention_and_matmuls_by_hand():
    """bench_iteration.flop_counter: torch's counter knows no CPU attention kernel; taught it, a forward + backward
    of x @ W and of one attention call add up to the hand-counted FLOPs (2mnk per matmul; attention 4·B·H·S²·D
    forward, and its backward the score recomputation plus four matmuls: 10·B·H·S²·D)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
    from bench_iteration import flop_counter

    b, h, s, d = 2, 3, 5, 4
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    x, w = torch.randn(7, 6), torch.randn(6, 8, requires_grad=True)
    with flop_counter() as counter:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
        attention = counter.get_total_flops()
        (x @ w).sum().backward()  # forward 2·7·6·8; backward only dW = xᵀ·g (x needs no gradient): 2·6·7·8
    assert attention == 4 * b * h * s * s * d + 10 * b * h * s * s * d
    assert counter.get_total_flops() - attention == 2 * 7 * 6 * 8 * 2


def test_the_flop_counter_counts_prepacked_linears_by_hand():
    """The frozen bf16 layers decode through oneDNN's linear on a prepacked weight (cpu/autocast_cache.py), an op
    torch's counter does not know: taught it, a (3, 5, 6) input times an (8, 6) weight counts 2·15·6·8."""
    import torch

    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        pytest.skip("this torch build has no oneDNN linear")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
    from bench_iteration import flop_counter

    x, w = torch.randn(3, 5, 6), torch.randn(8, 6)
    with flop_counter() as counter:
        y = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    assert y.shape == (3, 5, 8)
    assert counter.get_total_flops() == 2 * 15 * 6 * 8


def test_the_phase_floor_is_the_larger_of_arithmetic_and_weight_bytes_by_hand():
    """bench_workload.phase_floors: at 100 GFLOP/s and 10 GB/s, 0.5 GFLOP is 5 ms and 80 MB is 8 ms (bytes bound);
    2 GFLOP is 20 ms against 30 MB's 3 ms (flops bound); the total sums the phases' floors."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
    from bench_workload import phase_floors

    floors = phase_floors(
        dict(rollout=0.5, score_rollout=0.0, update=2.0), dict(rollout=80.0, update=30.0), gflops=100.0, bandwidth=10.0
    )
    assert floors["rollout"] == pytest.approx(8.0) and floors["rollout_bound"] == "bytes"
    assert floors["update"] == pytest.approx(20.0) and floors["update_bound"] == "flops"
    assert floors["total"] == pytest.approx(28.0)


def test_bench_decode_step_smoke(tmp_path):
    """benchmarks/speed/bench_decode_step.py --smoke: the tiny model, each variant in both dtypes, plain at 1.00x."""
    out = tmp_path / "step.json"
    stdout = run_script(["benchmarks/speed/bench_decode_step.py", "--smoke", "--json", str(out)], tmp_path)
    result = json.loads(out.read_text())["ms_per_step"]
    assert set(result) == {"bf16", "fp32"}
    for dtype in result.values():
        assert set(dtype) == {"plain", "decode cache", "+ stacked LoRA", "unpacked", "one adapter", "no adapter"}
        assert all(ms > 0 for ms in dtype.values())
    assert stdout.count("plain                 ") == 2 and "1.00x" in stdout


def test_bench_decode_gemm_smoke(tmp_path):
    """benchmarks/speed/bench_decode_gemm.py: one row count, one repeat; a line per row count with its rates, plain
    and packed."""
    import re

    stdout = run_script(["benchmarks/speed/bench_decode_gemm.py", "--rows", "2", "--repeats", "1"], tmp_path)
    rates = r"\s+\d+ GF/s\s+\d+ GF/s\s+\d+\.\d\s+\d+ GF/s\s+\d+ GF/s\s+\d+ GF/s$"
    assert re.search(r"^\s+2" + rates, stdout, re.M), stdout


def test_bench_precisions_smoke_and_a_really_quantized_int8_layer(tmp_path):
    """benchmarks/speed/bench_precisions.py: float32 is its own 1.00x baseline, int8 gets a row; and its int8 layer
    really is quantized (quantize_dynamic given a bare Linear would have left it float32 and timed float32 twice)."""
    import re
    import sys

    import torch

    args = ["benchmarks/speed/bench_precisions.py", "--formats", "float32", "int8", "--repeats", "1"]
    stdout = run_script(args, tmp_path)
    assert re.search(r"^\s+float32\s+\d+\.\d \(1\.00x\)\s+\d+\.\d \(1\.00x\)$", stdout, re.M), stdout
    assert re.search(r"^\s+int8\s+\d+\.\d \(\d\.\d\dx\)\s+\d+\.\d \(\d\.\d\dx\)$", stdout, re.M), stdout

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
    try:
        import bench_precisions
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    w, x = torch.randn(64, 32) / 32**0.5, torch.randn(4, 32)
    (layer,) = bench_precisions.linears("int8", [w])
    assert type(layer[0]) is not torch.nn.Linear  # swapped for torch.ao's dynamically quantized Linear
    with torch.no_grad():
        exact, quantized = x @ w.T, layer(x)
    err = (quantized - exact).abs().max().item()
    assert 0 < err < 0.05 * exact.abs().max().item()  # int8 rounding: close to float32, not equal to it


def _check_mc_vs_grpo(record: dict, sides: set[str], steps: int, dtype: str):
    assert set(record["summary"]) == sides and record["args"]["dtype"] == dtype
    for side, s in record["summary"].items():
        assert s["cpu_s_per_completion"] > 0 and s["peak_rss_mib"] > 0
        assert len(s["reward_curve"]) == steps
        phases = s["phase_cpu_s_per_completion"]
        assert set(phases) == {"rollout", "loss", "optimizer", "other"}
        assert phases["rollout"] > 0 and phases["loss"] > 0 and phases["optimizer"] > 0, (side, phases)
        matmul = "torch.bfloat16" if dtype == "bf16" else "torch.float32"
        assert s["matmul_dtype_by_phase"]["loss"] == [matmul], (side, s["matmul_dtype_by_phase"])


def test_mc_vs_grpo_smoke(tmp_path):
    """benchmarks/compare/vs_trl/mc_vs_grpo.py on the tiny model: both sides (GRPO's loss on both), one round, the
    CPU seconds per completion by phase, and one profiled run per side whose operators are charged to the phases."""
    path = tmp_path / "grpo.json"
    args = ["--rounds", "1", "--steps", "2", "--prompts", "2", "--group", "2", "--completion-length", "4"]
    stdout = run_script(
        ["benchmarks/compare/vs_trl/mc_vs_grpo.py", *args, "--sides", "ours", "trl", "--profile", "3"]
        + ["--json", str(path)],
        tmp_path,
    )
    record = json.loads(path.read_text())
    _check_mc_vs_grpo(record, {"ours", "trl"}, steps=2, dtype="fp32")
    for side in ("ours", "trl"):
        table = record["profiles"][side]["profile_top_ops_ms"]
        assert {"rollout", "loss", "optimizer"} <= set(table), table
    assert "CPU s/compl" in stdout and "profile, trl" in stdout


def test_mc_vs_grpo_real_model_lora_bf16_smoke(tmp_path, smollm2_path):
    """The real model with LoRA under bf16 autocast on both sides (slow: the real model asks for its fixture)."""
    path = tmp_path / "grpo.json"
    args = ["--model", smollm2_path, "--lora", "--dtype", "bf16", "--rounds", "1", "--steps", "1"]
    args += ["--prompts", "1", "--group", "2", "--completion-length", "3", "--sides", "ours", "trl"]
    run_script(["benchmarks/compare/vs_trl/mc_vs_grpo.py", *args, "--json", str(path)], tmp_path)
    _check_mc_vs_grpo(json.loads(path.read_text()), {"ours", "trl"}, steps=1, dtype="bf16")
