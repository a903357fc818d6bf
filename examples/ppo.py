# Single-model PPO (RLHF with a reward model), written the way scripts for TRL's last PPOTrainer were.
# TRL deleted PPOTrainer/PPOConfig in 1.13; the import below is the only line specific to trl-collm.
#
# Example (one GPU or CPU):
#
#   python examples/ppo.py \
#       --dataset_name trl-internal-testing/descriptiveness-sentiment-trl-style \
#       --dataset_train_split descriptiveness \
#       --output_dir outputs/ppo \
#       --learning_rate 3e-6 --per_device_train_batch_size 64 --gradient_accumulation_steps 1 \
#       --total_episodes 10000 \
#       --model_name_or_path EleutherAI/pythia-1b-deduped \
#       --sft_model_path EleutherAI/pythia-1b-deduped \
#       --reward_model_path EleutherAI/pythia-1b-deduped \
#       --missing_eos_penalty 1.0
#
# Add `--use_peft --lora_r 16 --lora_target_modules q_proj v_proj` to train a LoRA adapter (the reference policy is
# then the base model with the adapter switched off, so no second copy is loaded).
# `--dataset_name` may be a Hub id or a local folder/file that `datasets.load_dataset` reads (e.g. a folder holding
# train.jsonl and test.jsonl with a `prompt` column).

import shutil

import torch
from accelerate import PartialState
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser
from trl import ModelConfig, ScriptArguments, get_peft_config, get_quantization_config

from trl_collm import MultiAgentPPOConfig as PPOConfig
from trl_collm import MultiAgentPPOTrainer as PPOTrainer

PROMPT_COLUMN = "prompt"
HELD_OUT_ROWS = 100  # evaluation rows taken from the end of the train split when the dataset has no test split


def main():
    parser = HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_into_dataclasses()
    # Start from an empty output folder, so a saved model never mixes with files from an older run.
    shutil.rmtree(training_args.output_dir, ignore_errors=True)

    # ---------------------------------------------------------------- models and tokenizer
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    load_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=dtype,
        trust_remote_code=getattr(model_args, "trust_remote_code", False),
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        load_kwargs["quantization_config"] = quantization_config
        load_kwargs["device_map"] = {"": PartialState().local_process_index}

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, padding_side="left", trust_remote_code=load_kwargs["trust_remote_code"]
    )
    # As TRL's script did: always a new "[PAD]" token, and no resize of the models' embeddings. The trainer reads every
    # model through this tokenizer and never feeds a pad id to a model, so a pad without an embedding row is fine.
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})

    # The value model (critic) starts from the reward model, as in TRL's example.
    value_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path, num_labels=1, **load_kwargs
    )
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path, num_labels=1, **load_kwargs
    )
    policy = AutoModelForCausalLM.from_pretrained(training_args.sft_model_path, **load_kwargs)

    peft_config = get_peft_config(model_args)
    ref_policy = (
        None
        if peft_config is not None
        else AutoModelForCausalLM.from_pretrained(training_args.sft_model_path, **load_kwargs)
    )
    # ---------------------------------------------------------------- data: only `input_ids`, like TRL's PPO
    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    train_dataset = dataset[script_args.dataset_train_split]
    if script_args.dataset_test_split in dataset:
        eval_dataset = dataset[script_args.dataset_test_split]
    else:
        held_out = min(HELD_OUT_ROWS, len(train_dataset) // 2)
        eval_dataset = train_dataset.select(range(len(train_dataset) - held_out, len(train_dataset)))
        train_dataset = train_dataset.select(range(len(train_dataset) - held_out))

    def tokenize_prompts(ds):
        def tokenize(batch):
            return {"input_ids": tokenizer(batch[PROMPT_COLUMN], padding=False)["input_ids"]}

        return ds.map(tokenize, batched=True, remove_columns=ds.column_names, num_proc=training_args.dataset_num_proc)

    # Tokenize on the main process first; the others then read the cache.
    with PartialState().local_main_process_first():
        train_dataset = tokenize_prompts(train_dataset)
        eval_dataset = tokenize_prompts(eval_dataset)

    # ---------------------------------------------------------------- train
    trainer = PPOTrainer(
        args=training_args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=peft_config,
    )
    trainer.train()

    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)

    trainer.generate_completions()


if __name__ == "__main__":
    main()
