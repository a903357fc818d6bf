"""The generation wing: how the team is sampled.

- `sampler.py`: the sampling seam: `SamplingSettings` (what `team.json` records), the `GenerationBackend` contract and
  its registry (`register_backend`), `Sampler` (the one object the episode runners call) and `Generation`.
- `backends.py`: the built-in backends (`GenerateBackend`, `ContinuousBatchingBackend`) and `make_backend(args)`.
- `vllm_backend.py`: `VLLMBackend` (`use_vllm`) and the vLLM field checks (named so, not `vllm.py`, to leave the
  name `vllm` to the vLLM package itself).

Import the modules themselves (`from trl_collm.generation.sampler import Sampler`): this face imports nothing, so
that importing one backend never loads the others.
"""
