"""Golden digests of the plans of tests/plan_cases.py's requests (DP-SGD, the exponential
mechanisms, ExpM+NF and every selection kind, the per-training ε calibrated), computed
before the quote-latency work of issue 26: planning may get faster, never say something
else. A deliberate change of a plan updates its digest here, with the reason in the
commit (``.venv/bin/python benchmarks/plan_digests.py`` prints them)."""

from __future__ import annotations

import pytest

from tests.plan_cases import REQUESTS, plan_digest

GOLDEN = {
    "dpsgd rdp": "254bf3622dafbf57eca34169ee434b60026c9820506a94913f63e2776d255e03",
    "dpsgd pld": "a54fc184b712605088cd327286679f7410ec106173871b04484e8dc0687b7818",
    "dpsgd pld exponential": "6a1a3961b464434d01c33efda59fa28271af2c1bf28ab3db5a3cd1ee461c9a70",
    "dpsgd mlp": "57dce9b087a0515737c80fe9b5a836fe54b59940d7edbdf99474fba929969aee",
    "expm langevin": "ee32ca8b190222c1d9eb5da4dc246a0afbcd8d9c0a3f27b86c7be92fb5ee386d",
    "expm mcmc": "7904c6f49fe2aef65bb5d93208d3af26638d01eba8e99267f11256c9208df10f",
    "expm_nf": "f3ae24311ece986392b437db8cc60b893aeb24ec9919a2e59822e3c08e8f9112",
    "architecture paas": "ecd5694c2a907eebc856ff970ae5afaac3968071a486d8d8fbb33ff7401f1b83",
    "architecture rs": "343040807d72ed5f9e11ae64c76d9a505118f3217dcab2ce1279b9e395b77621",
    "architecture mgrs batches": (
        "edf3f41bcf99c4585c317c70cfb1f82a31963adcc03b774146336add716bab52"
    ),
    "architecture rs runs": "5249a90ad5cee07ef3879a946e3adb987fe959ab0b36f232088c75da4f04b208",
    "architecture rs report_noisy_max": (
        "98e327be0c929e6720121c6a439ca31b30febe3405fd5e4f94fef3ed7a275380"
    ),
    "architecture expm_nf": "71c7e9ab432148ad9faf1311f9a029672563c77ddec4899e33655797bffc24a8",
    "architecture given training_epsilon": (
        "cbb3838e581a2c6618e56426d4db872c1434aefc9febba0d64ff9f7ff9aec3a6"
    ),
    "hyperparameters tnb": "a9f0dd8215941dcba970ec7c4ae128ced91f1f19585001a6e53f007d42ba7ddd",
    "hyperparameters grid": "b050060d130ddc2793f4d41f1d0abd2928c8dc24347a9eae3c382068c34b05df",
    "hyperparameters poisson capped": (
        "1e0ea07307451c96f4e6cb3025cb62c21e5a6c37c14e9854598780a223016785"
    ),
    "hyperparameters poisson capped, too small": (
        "222b7cc2f18b5da3f70df98ee4644aaf6a72b3c4d092414b97fc3744ccb5bd09"
    ),
    "features cfs_greedy": "665bde030b48e6f846d1ab29b46306d4fbcde4fe6335357854b6b28bdef78543",
    "features cfs_ga final": "575c7035b98268f5d619d373d84cba7a7021f089f4f97b3e511a0edd751f73ba",
    "features pafs": "4184f2fe9c0ad8607951989c2d1c20fe48af1d358da2da5018e7d710813ed515",
}


def test_every_request_has_a_golden_digest() -> None:
    assert set(GOLDEN) == set(REQUESTS)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_plan_digest_is_unchanged(name: str) -> None:
    endpoint, body = REQUESTS[name]
    assert plan_digest(endpoint, body) == GOLDEN[name]
