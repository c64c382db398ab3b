"""GRU-D (Che et al. 2018, "Recurrent Neural Networks for Multivariate Time Series with
Missing Values", Sci. Rep. 8:6085) with a sigmoid head (forward returns the logit, (B,)),
or for an outcome of K ≥ 3 classes a head of K logits ((B, K), softmax).

Inputs, packed into one tensor so the model fits every (x, y) pipeline:
``x`` of shape (B, 3, T, V) — channel 0 values, 1 masks (1 = observed), 2 deltas (time
since the variable's last observation, in steps, Che et al. eq. 2) — or the same flattened
to (B, 3·T·V). Values at unobserved entries are ignored (set them to anything finite).

The empirical mean x̄ used for imputation is a fixed, *public* vector (from the dataset's
public schema), stored as a buffer; it is never estimated from private rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from service.datasets.timeseries import pack_grud_inputs


def pack_inputs(values: Tensor, masks: Tensor, deltas: Tensor) -> Tensor:
    """(B, T, V) ×3 → (B, 3, T, V). Unobserved values are zeroed so that NaNs never enter."""
    values = torch.where(masks > 0, values, torch.zeros_like(values))
    return torch.stack([values, masks, deltas], dim=1)


# The numpy twin of :func:`pack_inputs` is the schema's encoding (float32).
pack_inputs_np = pack_grud_inputs


class Grud(nn.Module):
    """GRU-D with ``n_vars`` input variables and ``hidden`` units."""

    x_mean: Tensor

    def __init__(
        self,
        n_vars: int,
        hidden: int,
        public_means: Tensor | None = None,
        classes: int | None = None,
    ) -> None:
        super().__init__()
        if public_means is None:
            public_means = torch.zeros(n_vars)
        if public_means.shape != (n_vars,):
            raise ValueError(f"public_means must have shape ({n_vars},)")
        self.n_vars = n_vars
        self.hidden = hidden
        self.register_buffer("x_mean", public_means.detach().to(torch.float32).clone())
        # Input decay γ_x = exp(−max(0, W_γx δ + b_γx)) with W_γx diagonal (Che et al. eq. 3).
        self.gamma_x_weight = nn.Parameter(torch.zeros(n_vars))
        self.gamma_x_bias = nn.Parameter(torch.zeros(n_vars))
        # Hidden decay γ_h = exp(−max(0, W_γh δ + b_γh)), W_γh full (Che et al. eq. 3).
        self.gamma_h = nn.Linear(n_vars, hidden)
        # GRU gates with the mask as extra input (Che et al. eq. 5): [x̂, m] → r, z, h̃.
        self.input_gates = nn.Linear(2 * n_vars, 3 * hidden)
        self.hidden_rz = nn.Linear(hidden, 2 * hidden, bias=False)
        self.hidden_candidate = nn.Linear(hidden, hidden, bias=False)
        # One logit (sigmoid), or K logits (softmax) for an outcome of K ≥ 3 classes.
        self.classes = classes
        self.head = nn.Linear(hidden, classes or 1)

    def split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if x.dim() == 2:
            x = x.reshape(x.shape[0], 3, -1, self.n_vars)
        if x.dim() != 4 or x.shape[1] != 3 or x.shape[3] != self.n_vars:
            raise ValueError(f"GRU-D expects inputs of shape (B, 3, T, {self.n_vars})")
        return x[:, 0], x[:, 1], x[:, 2]

    def last_observed(self, values: Tensor, masks: Tensor) -> Tensor:
        """x_{t'}: each variable's last observed value at or before t; x̄ before the first."""
        steps = torch.arange(values.shape[1], device=values.device).view(1, -1, 1)
        idx = torch.where(masks > 0, steps, torch.full_like(steps, -1)).cummax(dim=1).values
        gathered = values.gather(1, idx.clamp_min(0))
        return torch.where(idx >= 0, gathered, self.x_mean)

    def forward(self, x: Tensor) -> Tensor:
        values, masks, deltas = self.split(x)
        x_last = self.last_observed(values, masks)
        # Eq. 4: x̂ = m·x + (1 − m)(γ_x·x_last + (1 − γ_x)·x̄).
        gamma_x = torch.exp(-F.relu(deltas * self.gamma_x_weight + self.gamma_x_bias))
        x_hat = masks * values + (1 - masks) * (gamma_x * x_last + (1 - gamma_x) * self.x_mean)
        gamma_h = torch.exp(-F.relu(self.gamma_h(deltas)))  # (B, T, H)
        # The input parts of all gates for all steps in one matmul; only h is sequential.
        gates_in = self.input_gates(torch.cat([x_hat, masks], dim=-1))  # (B, T, 3H)
        h = values.new_zeros(values.shape[0], self.hidden)
        for t in range(values.shape[1]):
            h = gamma_h[:, t] * h  # eq. 6: ĥ_{t−1} = γ_h ⊙ h_{t−1}
            r_in, z_in, n_in = gates_in[:, t].chunk(3, dim=-1)
            r_h, z_h = self.hidden_rz(h).chunk(2, dim=-1)
            r = torch.sigmoid(r_in + r_h)
            z = torch.sigmoid(z_in + z_h)
            n = torch.tanh(n_in + self.hidden_candidate(r * h))
            h = (1 - z) * h + z * n
        logits = self.head(h)
        return logits if self.classes is not None else logits.squeeze(-1)
