"""Record seeded CC / DC / MC runs (metrics, a hash of the final weights, greedy texts) and compare two recordings:
the check that a refactor leaves every trajectory bitwise unchanged (used for the sampling seam and the house pass).

    PYTHONPATH=<old tree> python tools/record_runs.py record old.json
    PYTHONPATH=<new tree> python tools/record_runs.py record new.json [CASE ...]
    python tools/record_runs.py compare old.json new.json      # exit 1 on any difference

Nine cases cover the paths a refactor of the trainers or the sampler can move: PPO CC with separate models over two
turns with history, DC on a LoRA team with top-k / top-p, CC on continuous batching, CC with a stop token that really
fires, the iteration plan's shortcuts (one epoch: CC without KL, DC on a LoRA team with its KL term, the `collm`
preset), MC tree expansion over two turns, MC cross mode on a LoRA team. Metric key order is ignored; timings are left
out.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_collm.testing import CPU_RUN_SETTINGS, TOY_PROMPTS  # noqa: E402

PROMPTS = list(TOY_PROMPTS)

RUN = dict(CPU_RUN_SETTINGS, seed=0)
CASES = {
    "ppo_cc_sep_2turn": ("ppo", dict(critic_type="centralized", num_turns=2, agent_context="history", env=True)),
    "ppo_dc_lora_topk": ("ppo", dict(critic_type="decentralized", lora=True, top_k=5, top_p=0.9, temperature=0.8)),
    "ppo_cc_cb": (
        "ppo",
        dict(
            critic_type="centralized",
            use_transformers_continuous_batching=True,
            transformers_continuous_batching_config={"page_size": 16},
        ),
    ),
    "ppo_cc_stop_nolpscale": (
        "ppo",
        dict(critic_type="centralized", stop_token_id="frequent", scale_logits_by_temperature=False, temperature=0.7),
    ),
    # one epoch, one minibatch: the iteration plan's shortcuts (trl_collm/trainers/plan.py) on the path they take
    "ppo_cc_one_look": ("ppo", dict(critic_type="centralized", num_ppo_epochs=1, kl_coef=0.0)),
    "ppo_dc_lora_one_look_kl": ("ppo", dict(critic_type="decentralized", lora=True, num_ppo_epochs=1)),
    "ppo_collm_preset": ("ppo", dict(preset="collm", critic_type="centralized", num_ppo_epochs=1)),
    "mc_tree_2turn": ("mc", dict(num_turns=2, expansion="tree", env=True, stop_token_id="frequent")),
    "mc_cross_lora": ("mc", dict(joint_mode="cross", lora=True, max_joint_combinations=4)),
}


def _two_turn_env():
    from trl_collm import MultiAgentEnv, StepResult

    class TwoTurnEnv(MultiAgentEnv):
        def reset(self, row):
            self.t = 0
            return [f"{a} start {row['prompt']}" for a in ("a", "b")]

        def step(self, completions):
            self.t += 1
            reward = [len(completions[0]) % 5 / 5, completions[1].count("e") / 3]
            return StepResult(reward=reward, observations=[f"a turn {self.t}", f"b turn {self.t}"], done=self.t >= 2)

    return TwoTurnEnv()


def _frequent_token(path: str) -> int:
    """A token the tiny model samples often: a stop token that really ends completions."""
    from collections import Counter

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**enc, max_new_tokens=6, do_sample=True, top_k=0)[:, enc["input_ids"].shape[1] :]
    return Counter(out.flatten().tolist()).most_common(1)[0][0]


def _reward(prompts, completions, **kw):
    return [float(len(c) % 7) / 7.0 + 0.1 * c.count("e") for c in completions]


def _digest(module) -> str:
    tensors = {
        n: hashlib.sha256(p.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
        for n, p in module.state_dict().items()
    }
    return hashlib.sha256(json.dumps(tensors, sort_keys=True).encode()).hexdigest()


def run_case(name: str, out: str) -> dict:
    from datasets import Dataset
    from peft import LoraConfig

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import tiny_model_dir

    kind, cfg = CASES[name]
    cfg = dict(cfg)
    path = tiny_model_dir("tiny-qwen2")
    if cfg.pop("env", False):
        source = dict(env=_two_turn_env())
        cfg["agent_names"] = ["a", "b"]
    else:
        source = dict(reward_funcs=_reward)
        cfg["num_agents"] = 2
    if cfg.get("stop_token_id") == "frequent":
        cfg["stop_token_id"] = _frequent_token(path)
    lora = cfg.pop("lora", False)
    extra = dict(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])) if lora else {}
    data = Dataset.from_dict({"prompt": PROMPTS})
    common = dict(output_dir=out, response_length=6, **RUN, **cfg)
    if kind == "ppo":
        ppo = dict(per_device_train_batch_size=4, total_episodes=8, num_ppo_epochs=2, learning_rate=1e-3)
        args = MultiAgentPPOConfig(**{**ppo, **common})
        trainer = MultiAgentPPOTrainer(args=args, model=path, train_dataset=data, **source, **extra)
    else:
        args = MultiAgentMCConfig(
            num_generations=3, per_device_train_batch_size=2, total_episodes=4, learning_rate=1e-2, **common
        )
        trainer = MultiAgentMCTrainer(args=args, model=path, train_dataset=data, **source, **extra)
    trainer.train()
    greedy = trainer.rollout([{"prompt": p} for p in PROMPTS[:3]], greedy=True)
    texts = [[turn[a].gen.texts for a in greedy.agent_names] for turn in greedy.turns]
    from trl_collm.trainers.console import is_wall_clock

    metrics = [{k: v for k, v in m.items() if not is_wall_clock(k)} for m in trainer.metrics_history]
    return {"metrics": metrics, "weights": _digest(trainer.model), "greedy_texts": texts}


def record(out_file: str, names: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    results = {}
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as d:
            try:
                results[name] = run_case(name, d)
            except Exception as e:  # a case that cannot run is recorded, not hidden
                results[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, results[name].get("error") or results[name]["weights"], flush=True)
    with open(out_file, "w") as f:
        json.dump(results, f, indent=1)


def compare(a_file: str, b_file: str) -> int:
    with open(a_file) as f:
        a = json.load(f)
    with open(b_file) as f:
        b = json.load(f)
    differences = 0
    for name in sorted(set(a) & set(b)):
        same = a[name] == b[name]  # dicts compare without regard to key order; floats exactly
        print(f"{name}: {'equal' if same else 'DIFFERENT'}")
        differences += not same
    for name in sorted(set(a) ^ set(b)):
        print(f"{name}: only in {a_file if name in a else b_file}")
    return 1 if differences else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
