"""Randomness the guarantee depends on: seeded from the OS CSPRNG, never by a caller.

An analyst-chosen seed would let the analyst reproduce, and so subtract, the noise.
Known limit: torch's generators are not cryptographic, and floating-point Gaussian
sampling is open to the attacks of Mironov (2012, "On significance of the least
significant bits for differential privacy"); Opacus's `secure_mode` (torchcsprng) would
address both and is not available for this torch build.
"""

from __future__ import annotations

import secrets

import torch


def secure_generator(device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(secrets.randbits(63))
    return g
