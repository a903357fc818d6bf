"""GRPO's `generation_kwargs` for the sampler: which generation-config keys change the logits (and so leave the
recorded log-probs to a scoring forward), which are filters applied after the log-prob recorder, which are settings
of our own (refused, naming the setting), and the one parser `SamplingSettings` calls (generation/sampler.py).
"""

from __future__ import annotations

import json

# Settings that change the logits before a user's logits processor sees them: transformers runs custom processors
# (the log-prob recorder, generation/backends.py) after these and before the sampling warpers (temperature, top-k,
# top-p, min-p, typical-p, epsilon / eta cutoff). Key -> the values that leave the logits as the model gives them;
# vLLM's own penalties too (`generation_kwargs` may hold SamplingParams' names).
LOGIT_CHANGING_SETTINGS = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "sequence_bias": (None,),
    "guidance_scale": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
    "renormalize_logits": (None, False),
    "diversity_penalty": (None, 0.0),
    "watermarking_config": (None,),
    # vLLM's SamplingParams
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "min_tokens": (None, 0),
    "logit_bias": (None,),
    "bad_words": (None,),
    "allowed_token_ids": (None,),
}
# generation_kwargs keys that filter the distribution after the recorder (like top_p): the recorded log-probs stay
# the policy's, over the whole vocabulary at the temperature
WARPERS = ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
# generation_kwargs keys that are our own settings, or that the backends set themselves: key -> what to use instead
OWN_KEYS = {
    "max_new_tokens": "response_length (GRPO's max_completion_length)",
    "max_tokens": "response_length (GRPO's max_completion_length)",
    "max_length": "response_length (GRPO's max_completion_length)",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "eos_token_id": "stop_token_id",
    "stop_token_ids": "stop_token_id",
    "pad_token_id": "the tokenizer's pad token (the backends set it)",
    "do_sample": "eval / play's --sample (training samples)",
    "num_return_sequences": "num_generations (each row is one completion)",
    "n": "num_generations (each row is one completion)",
    "best_of": "num_generations (each row is one completion)",
    "num_beams": "sampling: one completion per row (beam search is not here)",
    "seed": "the trainer's seed (the backends draw one per call from torch's generator)",
    "logprobs": "nothing: the backends ask for the log-probs they need",
    "logits_processor": "nothing: the backends set their own",
    "stopping_criteria": "stop_token_id",
    "synced_gpus": "ds3_gather_for_generation",
    "cache_implementation": "nothing: generation uses each model's default KV cache",
}


def kwargs_change_logits(generation_kwargs: dict) -> bool:
    """Whether a `generation_kwargs` entry penalises, forces or suppresses tokens, or is not known to be a warper."""
    for key, value in generation_kwargs.items():
        neutral = LOGIT_CHANGING_SETTINGS.get(key)
        if (neutral is not None and value not in neutral) or (neutral is None and key not in WARPERS):
            return True
    return False


def parse_generation_kwargs(value) -> dict:
    """GRPO's `generation_kwargs` as a dict (None: empty; a JSON object's text from the command line: parsed); keys
    that are our own settings refused, naming the setting; the values must be JSON (team.json records them)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(
                f"`generation_kwargs`={value!r} is not a JSON object ({e}); e.g. '{{\"typical_p\": 0.9}}'."
            ) from e
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            f"`generation_kwargs` must be a dict of keyword arguments (GenerationConfig's or vLLM SamplingParams' "
            f"names), got {value!r}."
        )
    own = sorted(k for k in value if k in OWN_KEYS)
    if own:
        k = own[0]
        raise ValueError(f"`generation_kwargs` sets {k!r}, a setting of its own here: set {OWN_KEYS[k]} instead.")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"`generation_kwargs` must hold JSON values (numbers, strings, lists, dicts: team.json records them): {e}."
        ) from e
    return dict(value)
