"""CPU ms of one decoding step of a LoRA team, with and without this project's decoding adaptations.

A team decodes all its agents in one batch: one shared base, each row routed to its agent's LoRA adapter (PEFT's
mixed-adapter batch). This times one step (a forward of one new token per row on top of a prompt's KV cache) of
SmolLM2-135M-Instruct with two adapters on q_proj / v_proj, half the rows each, in these variants, measured in
alternating rounds in one process (CPU seconds, one thread):

- `plain`: transformers' `DynamicCache` (a `torch.cat` of every layer's cache per step) and PEFT's mixed batch;
- `decode cache`: `trl_collm.cpu.kv_cache.DecodeCache` (written in place) and PEFT's mixed batch;
- `+ stacked LoRA`: DecodeCache and `trl_collm.cpu.lora_mixed` (the mixed batch as two stacked matmuls per layer),
  what the trainers run on a CPU (under bf16 with the frozen weights prepacked for oneDNN: `cpu/autocast_cache.py`);
- `unpacked`: the same with the frozen weights multiplied by `F.linear` (bf16: reordered at every call; float32:
  MKL's product on the plain layout) instead of oneDNN's prepacked copies;
- `one adapter` / `no adapter`: the same step with one adapter for all rows / the bare base (what the mixing costs).

Under `--dtype bf16` the model runs under CPU bf16 autocast with the trainers' other CPU adaptations (bf16 copies of
the frozen weights, float32 attention: `trl_collm.cpu.adapt_for_cpu`).

    python benchmarks/speed/bench_decode_step.py --dtype bf16 fp32        # 16 rows, 160-token prompts, 24 steps
    python benchmarks/speed/bench_decode_step.py --rows 64 --rounds 3
    python benchmarks/speed/bench_decode_step.py --smoke                  # the tiny offline model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = ("plain", "decode cache", "+ stacked LoRA", "unpacked", "one adapter", "no adapter")


def build_team(model_path: str, bf16: bool):
    """The base with two LoRA adapters ("a", "b") at random (non-identity) values, eval mode."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    team = get_peft_model(base, config, adapter_name="a")
    team.add_adapter("b", config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in team.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    from trl_collm.cpu import adapt_for_cpu

    adapt_for_cpu(team)  # as the trainers run on a CPU (measure() switches the stacked LoRA per variant)
    return team.eval()


def step_ms(team, ids, variant: str, steps: int) -> float:
    """CPU ms per decoding step of `variant` after a prefill of `ids` (every row real: no padding)."""
    import contextlib

    import torch
    from transformers import DynamicCache

    from trl_collm.cpu.kv_cache import DecodeCache
    from trl_collm.cpu.lora_mixed import stacks_kept
    from trl_collm.team.prefix import cache_keyword, position_ids_from_mask

    rows = ids.shape[0]
    names = {"one adapter": None, "no adapter": None}.get(variant, ["a"] * (rows // 2) + ["b"] * (rows - rows // 2))
    extra = {} if names is None else {"adapter_names": names}
    cache = DynamicCache() if variant == "plain" else DecodeCache(steps + 1)
    mask = torch.ones_like(ids)
    positions = position_ids_from_mask(mask)
    off = team.disable_adapter() if variant == "no adapter" else contextlib.nullcontext()
    with off, stacks_kept():  # one decoding pass, as the generate backend runs it
        team(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1, use_cache=True,
             **extra, **{cache_keyword(team): cache})  # fmt: skip
        token = ids[:, -1:]
        c0 = time.process_time()
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            positions = positions[:, -1:] + 1
            team(input_ids=token, attention_mask=mask, position_ids=positions, use_cache=True,
                 **extra, **{cache_keyword(team): cache})  # fmt: skip
        return 1000 * (time.process_time() - c0) / steps


def use_prepacked(team, on: bool) -> None:
    """Frozen weights multiplied prepacked (`on`) or through `F.linear` (cpu/autocast_cache.py)."""
    for module in team.modules():
        if getattr(module, "_autocast_cached", False):
            module._prepack = on


def use_stacked(team, on: bool) -> None:
    """Mixed-adapter batches through cpu/lora_mixed.py (`on`) or PEFT's own `_mixed_batch_forward`."""
    from trl_collm.cpu.lora_mixed import stack_mixed_lora_batches

    for module in team.modules():
        if vars(module).pop("_collm_stacked", False):
            del module._mixed_batch_forward  # the instance's stacked method: PEFT's class method shows again
    if on:
        stack_mixed_lora_batches(team)


def measure(model_path: str, dtype: str, rows: int, prompt: int, steps: int, rounds: int) -> dict:
    import torch

    torch.set_num_threads(1)
    bf16 = dtype == "bf16"
    team = build_team(model_path, bf16)
    vocab = team.config.vocab_size
    ids = torch.randint(10, vocab - 10, (rows, prompt), generator=torch.Generator().manual_seed(1))
    got = {v: [] for v in VARIANTS}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        use_stacked(team, True)
        step_ms(team, ids, "+ stacked LoRA", 2)  # warm-up: kernels, the bf16 weight copies
        for r in range(rounds):
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                use_stacked(team, variant not in ("plain", "decode cache"))
                use_prepacked(team, variant != "unpacked")
                got[variant].append(step_ms(team, ids, variant, steps))
    return {v: statistics.median(t) for v, t in got.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=("fp32", "bf16"), default=["bf16", "fp32"])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=160, help="prompt tokens before the decoded ones")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="the tiny offline model, 4 rows, 2 steps, 1 round")
    a = p.parse_args()
    from trl_collm.hardware import cpu_description

    if a.smoke:
        from trl_collm.testing import tiny_model_dir

        model, a.rows, a.prompt, a.steps, a.rounds = tiny_model_dir(), 4, 8, 2, 1
    else:
        from trl_collm.team.pretrained import smollm2_135m_instruct

        model = smollm2_135m_instruct()
    print(f"{cpu_description()}; {a.rows} rows, {a.prompt}-token prompts, {a.steps} steps, one thread", flush=True)
    results = {}
    for dtype in a.dtype:
        results[dtype] = measure(model, dtype, a.rows, a.prompt, a.steps, a.rounds)
        plain = results[dtype]["plain"]
        print(f"\n{dtype}: CPU ms per decoding step (median of {a.rounds} rounds)")
        for variant, ms in results[dtype].items():
            print(f"  {variant:<16} {ms:8.1f}   {plain / ms:5.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(options=vars(a), cpu=cpu_description(), ms_per_step=results), f, indent=1)


if __name__ == "__main__":
    main()
