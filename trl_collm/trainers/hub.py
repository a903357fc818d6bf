"""Publishing a trained team to the Hugging Face Hub: every agent folder, team.json, the team card and the critic,
as one upload of output_dir (the trainer's `push_to_hub`)."""

from __future__ import annotations

from .output_dir import LOCK_FILE

# What output_dir holds that is not the team: private files, resumable checkpoints, TensorBoard runs, the run's lock.
_NOT_THE_TEAM = ["_*", "checkpoint-*", "checkpoint-*/**", "runs/**", LOCK_FILE]


def push_team(trainer, commit_message, blocking, token, revision, include_critic, card_kwargs: dict):
    """Save the team, write its card and upload output_dir (the critic too unless `include_critic` is False).
    Every rank saves (a collective under ZeRO-3); only the main process writes the card and uploads."""
    import transformers.trainer as hf_trainer

    args = trainer.args
    model_name = (
        card_kwargs.pop("model_name", None) or (args.hub_model_id or args.output_dir).rstrip("/").split("/")[-1]
    )
    token = token if token is not None else args.hub_token
    if trainer.hub_model_id is None:
        trainer.init_hf_repo(token=token)
    trainer.save_model(_internal_call=True)
    if not trainer.is_world_process_zero():
        return None
    trainer.create_model_card(model_name=model_name, **card_kwargs)
    ignore = _NOT_THE_TEAM + ([] if include_critic else ["critic/*", "critic/**"])
    return hf_trainer.hf_api().upload_folder(
        repo_id=trainer.hub_model_id,
        folder_path=args.output_dir,
        commit_message=commit_message,
        token=token,
        run_as_future=not blocking,
        ignore_patterns=ignore,
        revision=revision or args.hub_revision,
    )
