"""Comparing the weights of two training runs whose float paths differ only by rounding."""

import torch


def assert_trained_weights_close(on: torch.Tensor, off: torch.Tensor, lr: float) -> None:
    """Weights after the same Adam steps on two float paths that differ by rounding.

    Adam divides each step by the root of its squared gradient, so an element whose gradient is itself at rounding
    level (~1e-9) takes a step of any size up to ``lr`` from noise alone: one such element in 50k differed by 4e-6 on
    an AVX2 machine. Nearly every element must match tightly, and no element may be off by more than a hundredth of
    one step; a wrong prefix (a shifted position, a missing token) moves most elements by a whole step.
    """
    on, off = on.flatten(), off.flatten()
    tight = torch.isclose(on, off, rtol=1e-4, atol=1e-6)
    # one in a thousand, and at least one element (a LoRA team of the tiny model has ~900 trained weights an agent)
    allowed = max(1, on.numel() // 1000)
    assert (~tight).sum().item() <= allowed, f"{(~tight).sum().item()} of {on.numel()} elements differ"
    assert (on - off).abs().max().item() <= lr / 100


def trained_weights(trainer) -> dict[str, torch.Tensor]:
    """Every agent's trained parameters, flattened into one tensor per agent (what the comparison above reads)."""
    return {a: torch.cat([p.detach().flatten() for p in trainer.team.agent_parameters(a)]) for a in trainer.team.names}
