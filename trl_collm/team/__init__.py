"""The team wing: the agents' models, how a team is assembled from the trainer's arguments, and how it is saved.

- `agents.py`: `AgentTeam` (separate models or LoRA adapters on one base; encoding, log-probs, adapter parameters).
- `assembly.py`: the trainer's one / list / dict / path arguments -> names, tokenizers, an `AgentTeam`; `TeamModel`.
- `modeling.py`: what a transformers model is made of, token-row padding; a leaf that imports nothing of ours.
- `prefix.py`: the shared-prefix forward (prompt tokens that rows share computed once).
- `names.py`: the one check of agent names.
- `saved.py`: the saved-team format (`team.json`, `write_team`, `load_team`); `card.py`: the team's model card.
- `pretrained.py`: the packaged real models (SmolLM2-135M-Instruct, offline from PyPI).
- `load_report.py`: transformers' load report for a value model made from a causal LM, turned into one line.

Import the modules themselves (`from trl_collm.team.agents import AgentTeam`): this face imports nothing, so that
`import trl_collm` (which installs the load-report filter from here) stays free of torch.
"""
