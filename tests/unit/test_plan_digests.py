"""Golden digests of the plans of tests/plan_cases.py's requests (DP-SGD, the exponential
mechanisms, ExpM+NF and every selection kind, the per-training ε calibrated), computed
before the quote-latency work of issue 26: planning may get faster, never say something
else. A deliberate change of a plan updates its digest here, with the reason in the
commit (``.venv/bin/python benchmarks/plan_digests.py`` prints them)."""

from __future__ import annotations

import pytest

from tests.plan_cases import REQUESTS, plan_digest

GOLDEN = {
    "dpsgd rdp": "c0ef73d256d16c4f6f6d895c6ae5f7d4be9073344030054f779faee65efa3404",
    "dpsgd pld": "a8f3b0271cce2786ee9831b498f0ce99154278de0571c6676b5df75fcb350d33",
    "dpsgd pld exponential": "bb682c2774479fbcb294ddb3ff926e31d4652fd0e51981b43dc76eddc547869f",
    "dpsgd mlp": "738e107ce3cec432764bf62f24ff0471c5236a0e00cd32694cc635f56a6f4ee8",
    "expm langevin": "8a059f25523a57e88c7caf3f0e8e601768d8188f58ecec6dbadb6fd81728cc17",
    "expm mcmc": "ef6f8166a9cd11dc6adae30a8ecca475c6a7b18c018a5b54a3aa33d35b3af148",
    "expm_nf": "f3ae24311ece986392b437db8cc60b893aeb24ec9919a2e59822e3c08e8f9112",
    "architecture paas": "66636dbe0118cd8582d8cbf4fe01ab7ce1286b8f4f904825d1bb907158fc8e72",
    "architecture rs": "ce9c544bc426d8970ed7310ca8e8c0d6cabddb465279aea4e58e186189dd86b4",
    "architecture mgrs batches": (
        "c7e7cebffab8cc8865e2e5199a468d1229410604dcaf98dd1d18b1eb5acbde0f"
    ),
    "architecture rs runs": "dfa4b82dfbefb526683dc2abd20bdd42df2cb7dcfaa0146d15e2b2edfef372ad",
    "architecture rs report_noisy_max": (
        "2903e56834a1dd9014a1835cbfe91593b03caa3462dd8578c7108f77d4fbbaf6"
    ),
    "architecture expm_nf": "e2c343cb5229676115da6f2d16e9bc0ced58512c250a4a0eb7412d08bb16228f",
    "architecture given training_epsilon": (
        "64d086c56740504c651ba98c99e8d3b22baa634a63e87c8c54cb42a9eb429847"
    ),
    "hyperparameters tnb": "2ecae2af1f9af4ba77b4ede2a68d30eecde6ad0768113dd704b083f979489da0",
    "hyperparameters grid": "1d7ba656f08b58c6d6b1900671e41ec23b710603f91668644958e80dd486725c",
    "hyperparameters poisson capped": (
        "693cf2bab2dea813004348fd7f5408fb90ca92c8e8fdc2677608b1c9acb04a35"
    ),
    "hyperparameters poisson capped, too small": (
        "222b7cc2f18b5da3f70df98ee4644aaf6a72b3c4d092414b97fc3744ccb5bd09"
    ),
    "features cfs_greedy": "665bde030b48e6f846d1ab29b46306d4fbcde4fe6335357854b6b28bdef78543",
    "features cfs_ga final": "ba89487b661a8a2c2763d38336d92fb637e38f5d2e8cfcf5608ad704468e8e82",
    "features pafs": "2c4be0b52fdf082bb261f09b7759770dac82bc2aabfc707983905dbda391220b",
}


def test_every_request_has_a_golden_digest() -> None:
    assert set(GOLDEN) == set(REQUESTS)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_plan_digest_is_unchanged(name: str) -> None:
    endpoint, body = REQUESTS[name]
    assert plan_digest(endpoint, body) == GOLDEN[name]
