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
    "architecture paas": "8e7834c353cd34cb4312bd602174290720bff8788d5739d76328b80058dd16b1",
    "architecture rs": "d8b2077835c8da0801af917cea6c61da91d3a8a8919d6364aa29b7ce3aad88a4",
    "architecture mgrs batches": (
        "104bd27f1352ed5617f342dcf263548a4a30cc69b50921f9830c3397453216ed"
    ),
    "architecture rs runs": "2b59a86a5964bede45baefe63da51175b0b3f9e212a0bef4278d724cb1d95631",
    "architecture rs report_noisy_max": (
        "a271b94a40f8f31b03dbdbe38c83992aefcf5322c4bf43c559e007606c7847e2"
    ),
    "architecture expm_nf": "0bd2bb12a2ede47bb1b6ec69acc9ca37f5567fd1f92975afc1e9d0be5c1e4075",
    "architecture given training_epsilon": (
        "64d086c56740504c651ba98c99e8d3b22baa634a63e87c8c54cb42a9eb429847"
    ),
    "hyperparameters tnb": "cd1069f5857d5c763c595f2bb57610933aaf0fc476e61f54b7f185b02f73923b",
    "hyperparameters grid": "a67ff7bc6a78e88b1f0d7335d969a464a691f2dd082bbd2dcba169d73e4a922e",
    "hyperparameters poisson capped": (
        "dfd8747fe4ec2d1f94a1538e41a9bc9ecb3521c925ae0a0f2f754e139a8fcf43"
    ),
    "hyperparameters poisson capped, too small": (
        "222b7cc2f18b5da3f70df98ee4644aaf6a72b3c4d092414b97fc3744ccb5bd09"
    ),
    "features cfs_greedy": "665bde030b48e6f846d1ab29b46306d4fbcde4fe6335357854b6b28bdef78543",
    "features cfs_ga final": "ba89487b661a8a2c2763d38336d92fb637e38f5d2e8cfcf5608ad704468e8e82",
    "features pafs": "fda6d9be8352f776c58c265cc8406a513872556390f1850afaed8d9749678f9d",
}


def test_every_request_has_a_golden_digest() -> None:
    assert set(GOLDEN) == set(REQUESTS)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_plan_digest_is_unchanged(name: str) -> None:
    endpoint, body = REQUESTS[name]
    assert plan_digest(endpoint, body) == GOLDEN[name]
