"""Randomness the guarantee depends on: seeded from the OS CSPRNG, never by a caller.

An analyst-chosen seed would let the analyst reproduce, and so subtract, the noise.
DP-SGD's noise and Poisson sampling do not use these torch generators: they come from
worker/noise.py (a ChaCha20 stream keyed from the OS CSPRNG, integer noise that closes
the floating-point attacks of Mironov 2012). What still draws from a torch generator here
is the ExpM+NF flow's base samples and training minibatches, whose guarantee is nominal
anyway; torch's generators are not cryptographic, only seeded from the OS CSPRNG.
"""

from __future__ import annotations

import secrets

import torch


def secure_generator(device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(secrets.randbits(63))
    return g
