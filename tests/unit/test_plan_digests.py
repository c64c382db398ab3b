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
    "architecture paas": "7797e6ce2d53db591674de307ac529841978288a84892427f0d8a004706a051d",
    "architecture rs": "cd90252a837ecb42f3d7dfc69a25eaf27afc8cc80b2072e205c1ff77d45932b2",
    "architecture mgrs batches": (
        "4bfc3111a2953a0acbde404ebada372483ddb16cb80c4a1f601f0cab7a8fe393"
    ),
    "architecture rs runs": "7a9f3bfabab24efd6d131232b6b64853b4dc4ea31ac95b28edcb0ba9f1dcf821",
    "architecture rs report_noisy_max": (
        "3d2d50dcc6db5dc9f9922e3f723de122415f546bfb4fb58d8a306d57c91332be"
    ),
    "architecture expm_nf": "71c7e9ab432148ad9faf1311f9a029672563c77ddec4899e33655797bffc24a8",
    "architecture given training_epsilon": (
        "64d086c56740504c651ba98c99e8d3b22baa634a63e87c8c54cb42a9eb429847"
    ),
    "hyperparameters tnb": "1672bae7a782e524b534e8b46697abe084520cd53da5ba018de9705c3357e25c",
    "hyperparameters grid": "0ef29fbc796f5886e640914da6c3889cbd6ae5fa49500470c7f7dbf774e1b9f4",
    "hyperparameters poisson capped": (
        "112b5e3509cedeaaa5b53d2c10be400045b992f5cfd07eda358f3053e4e8cbe0"
    ),
    "hyperparameters poisson capped, too small": (
        "222b7cc2f18b5da3f70df98ee4644aaf6a72b3c4d092414b97fc3744ccb5bd09"
    ),
    "features cfs_greedy": "665bde030b48e6f846d1ab29b46306d4fbcde4fe6335357854b6b28bdef78543",
    "features cfs_ga final": "ba89487b661a8a2c2763d38336d92fb637e38f5d2e8cfcf5608ad704468e8e82",
    "features pafs": "66d0f83504a5910758fc8f278417dc62732e5d3fc270031644165dd2113511c8",
}


def test_every_request_has_a_golden_digest() -> None:
    assert set(GOLDEN) == set(REQUESTS)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_plan_digest_is_unchanged(name: str) -> None:
    endpoint, body = REQUESTS[name]
    assert plan_digest(endpoint, body) == GOLDEN[name]
