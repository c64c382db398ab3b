"""`enclave admin audit` (enclave/audit_cli.py): the sentence that puts the figure beside
its ceiling, a real audit run through the command, and its refusals; its flags, one per
field of POST /v1/admin/audits (--model, --dpsgd and --expm included)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from enclave.audit_cli import audit_sentence, request_body
from enclave.cli import app
from service.modelspec import GrudSpec, LogisticSpec, MlpSpec
from service.privacy.one_run_audit import epsilon_lower_bound
from service.schemas.audits import AuditRequest
from service.schemas.dpsgd import DpsgdOptions
from service.schemas.expm import ExpmOptions
from service.schemas.expm_nf import ExpmNfOptions

runner = CliRunner()


def test_sentence_states_the_ceiling_beside_the_figure() -> None:
    b = epsilon_lower_bound(canaries=1000, guesses=200, correct=140, confidence=0.95)
    text = audit_sentence(b)
    assert text == (
        f"ε ≥ {int(b.epsilon * 100) / 100:.2f} at 95% (this test cannot show more than 5.81 "
        "with 1,000 canaries): a lower bound, not a proof"
    )
    assert b.epsilon > 0.0
    # Nothing right at all: 0, still with the ceiling.
    zero = epsilon_lower_bound(canaries=50, guesses=10, correct=0, confidence=0.9)
    assert audit_sentence(zero).startswith("ε ≥ 0.00 at 90% (this test cannot show more than ")


def test_command_runs_an_audit_on_adult() -> None:
    r = runner.invoke(
        app,
        [
            "admin",
            "audit",
            "--method",
            "dpsgd",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--canaries",
            "60",
        ],
    )
    assert r.exit_code == 0, r.output
    first, second = r.output.strip().splitlines()
    assert re.fullmatch(
        r"ε ≥ \d+\.\d\d at 95% \(this test cannot show more than \d+\.\d\d with 60 canaries\): "
        r"a lower bound, not a proof",
        first,
    )
    assert "of 12 guesses right on 60 canaries" in second
    assert "nothing charged" in second


def test_command_refusals() -> None:
    base = ["admin", "audit", "--epsilon", "1", "--delta", "1e-5"]
    r = runner.invoke(app, [*base, "--method", "expm_nf", "--canaries", "10"])
    assert r.exit_code == 1 and "delta = 0" in r.output  # pure ε: audited at δ = 0 only
    r = runner.invoke(app, [*base, "--method", "expm", "--canaries", "10", "--dataset", "icu"])
    assert r.exit_code == 1 and "cannot be audited" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--canaries", "201", "--dataset", "icu"])
    assert r.exit_code == 1 and "out of range for icu" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--canaries", "100000"])
    assert r.exit_code == 1 and "out of range for adult" in r.output
    r = runner.invoke(
        app,
        [
            "admin",
            "audit",
            "--method",
            "dpsgd",
            "--epsilon",
            "1000",
            "--delta",
            "1e-5",
            "--canaries",
            "10",
        ],
    )
    assert r.exit_code == 1 and "epsilon" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--canaries", "10", "--dataset", "mine"])
    assert r.exit_code == 1 and "unknown public dataset" in r.output
    gradient = [*base, "--canary-kind", "gradient"]
    r = runner.invoke(app, [*gradient, "--method", "expm", "--canaries", "10"])
    assert r.exit_code == 1 and "gradient canaries need" in r.output
    r = runner.invoke(app, [*gradient, "--method", "dpsgd", "--canaries", "106"])
    assert r.exit_code == 1 and "more than the model's 105 parameters" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--canaries", "10", "--canary-kind", "x"])
    assert r.exit_code == 2 and "'input', 'gradient'" in r.output


def test_command_runs_a_gradient_canary_audit_on_adult() -> None:
    base = ["admin", "audit", "--method", "dpsgd", "--epsilon", "4", "--delta", "1e-5"]
    r = runner.invoke(app, [*base, "--canaries", "20", "--canary-kind", "gradient"])
    assert r.exit_code == 0, r.output
    assert "of 4 guesses right on 20 gradient canaries" in r.output


def test_command_runs_a_lira_audit_on_an_adult_pool() -> None:
    base = ["admin", "audit", "--method", "dpsgd", "--epsilon", "1", "--delta", "1e-5"]
    r = runner.invoke(app, [*base, "--attack", "lira", "--shadow-models", "8", "--pool", "200"])
    assert r.exit_code == 0, r.output
    first, second, third = r.output.strip().splitlines()
    assert re.fullmatch(
        r"LiRA \(8 models on 200 public Adult rows\): TPR \d\.\d{4} at 0\.1% FPR, "
        r"\d\.\d{4} at 1% FPR; AUC \d\.\d{3}; ε ≥ \d+\.\d\d at 95% \(this test cannot show "
        r"more than \d+\.\d\d; it treats one model's rows as independent: not a certificate\)",
        first,
    )
    assert second.startswith("one-run bound of one held-out target: ε ≥ ")
    assert second.endswith("with 200 canaries): a lower bound, not a proof")
    assert "of 40 guesses right on 200 pool rows as canaries" in third
    assert "σ = " in third and "nothing charged" in third


def test_lira_command_refusals() -> None:
    base = ["admin", "audit", "--epsilon", "1", "--delta", "1e-5", "--attack", "lira"]
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--canaries", "10"])
    assert r.exit_code == 1 and "canaries is for one-run audits only" in r.output
    r = runner.invoke(app, [*base, "--method", "expm_nf"])
    assert r.exit_code == 1 and "delta = 0" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--dataset", "icu"])
    assert r.exit_code == 1 and "pool of public adult" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--shadow-models", "2"])
    assert r.exit_code == 1 and "shadow_models" in r.output
    r = runner.invoke(app, [*base, "--method", "dpsgd", "--pool", "40000"])
    assert r.exit_code == 1 and "out of range for adult" in r.output
    r = runner.invoke(app, [*base[:-2], "--method", "dpsgd", "--pool", "300", "--canaries", "9"])
    assert r.exit_code == 1 and "for LiRA audits (--attack lira) only" in r.output
    r = runner.invoke(app, [*base[:-2], "--method", "dpsgd"])
    assert r.exit_code == 1 and "--canaries is required" in r.output
    r = runner.invoke(app, [*base[:-2], "--method", "dpsgd", "--attack", "mia"])
    assert r.exit_code == 2 and "'one_run', 'lira'" in r.output


REQUIRED = {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "confidence": 0.9}
FLAGS = {**REQUIRED, "dataset": "adult", "canary_kind": "input", "attack": "one_run"}


def test_the_flags_name_every_field_of_the_audit_request() -> None:
    """One flag per field the API declares for an audit, no other: --model (a kind or a
    JSON spec), --dpsgd, --expm and --expm-nf (JSON objects) become the request's objects
    as given."""
    body = request_body(
        **FLAGS,
        model='{"kind": "mlp", "hidden": [8, 4], "activation": "relu"}',
        canaries=40,
        guesses=8,
        dpsgd='{"engine": "ghost", "epochs": 1}',
        expm='{"sampler": "mcmc", "chains": 2}',
        expm_nf='{"steps": 50, "n_samples_per_step": 8}',
        shadow_models=8,
        pool=200,
    )
    assert set(body) == set(AuditRequest.model_fields)
    request = AuditRequest.model_validate(body)
    assert request.model == MlpSpec(hidden=[8, 4], activation="relu")
    assert request.dpsgd == DpsgdOptions(engine="ghost", epochs=1)
    assert request.expm == ExpmOptions(sampler="mcmc", chains=2)
    assert request.expm_nf == ExpmNfOptions(steps=50, n_samples_per_step=8)
    assert (request.canaries, request.guesses, request.shadow_models, request.pool) == (
        40,
        8,
        8,
        200,
    )
    assert (request.confidence, request.canary_kind, request.attack) == (0.9, "input", "one_run")
    # A kind alone; no --model: the dataset's model; optional fields not given: left out.
    assert request_body(**FLAGS, model="mlp")["model"] == {"kind": "mlp"}
    assert AuditRequest.model_validate(request_body(**FLAGS, model=None)).model == LogisticSpec()
    icu = request_body(**{**FLAGS, "dataset": "icu"}, model=None)
    assert AuditRequest.model_validate(icu).model == GrudSpec()
    assert set(icu) == set(FLAGS) | {"model"}


def test_command_runs_an_mlp_audit_on_adult() -> None:
    """DP-SGD on an MLP with the ghost engine, one epoch (kept short), through the command."""
    base = ["admin", "audit", "--method", "dpsgd", "--epsilon", "1", "--delta", "1e-5"]
    dpsgd = '{"engine": "ghost", "epochs": 1}'
    r = runner.invoke(app, [*base, "--model", "mlp", "--dpsgd", dpsgd, "--canaries", "40"])
    assert r.exit_code == 0, r.output
    first, second = r.output.strip().splitlines()
    assert first.endswith("with 40 canaries): a lower bound, not a proof")
    assert "of 8 guesses right on 40 canaries; dpsgd MLP on adult (30,162 rows)" in second
    assert "σ = " in second and " steps, q = " in second


def test_command_runs_an_audit_of_expm_hmc_sampler() -> None:
    """ExpM's HMC sampler (short chains, as tests/unit/test_worker_audits.py's): the
    report names the sampler."""
    mcmc = '{"sampler": "mcmc", "chains": 2, "steps": 10, "warmup": 10, "leapfrog_steps": 4}'
    base = ["admin", "audit", "--method", "expm", "--epsilon", "1", "--delta", "1e-5"]
    r = runner.invoke(app, [*base, "--expm", mcmc, "--canaries", "30"])
    assert r.exit_code == 0, r.output
    second = r.output.strip().splitlines()[1]
    assert "of 6 guesses right on 30 canaries; expm (mcmc) logistic regression on adult" in second
    assert "; 10 steps; " in second and "σ" not in second


def test_model_and_options_refusals() -> None:
    """What the request's schema or the audit refuses is the API's 422 text on one line
    (exit 1); text that is not a JSON object is refused before any request."""
    base = ["admin", "audit", "--epsilon", "1", "--delta", "1e-5", "--canaries", "40"]

    def refusal(*args: str) -> str:
        r = runner.invoke(app, [*base, *args])
        assert r.exit_code == 1, r.output
        (line,) = r.output.strip().splitlines()
        return line

    assert "expm options are for method 'expm' only" in refusal(
        "--method", "dpsgd", "--expm", '{"sampler": "mcmc"}'
    )
    assert "dpsgd options are for method 'dpsgd' only" in refusal(
        "--method", "expm", "--dpsgd", '{"epochs": 1}'
    )
    assert "model 'mlp' cannot be audited with expm on adult" in refusal(
        "--method", "expm", "--model", "mlp"
    )
    assert "model.mlp.hidden: List should have at least 1 item" in refusal(
        "--method", "dpsgd", "--model", '{"kind": "mlp", "hidden": []}'
    )
    assert "expm.sampler" in refusal("--method", "expm", "--expm", '{"sampler": "gibbs"}')
    assert "--dpsgd must be a JSON object, got '[1]'" in refusal(
        "--method", "dpsgd", "--dpsgd", "[1]"
    )
    assert "--model must be a JSON object: Expecting" in refusal(
        "--method", "dpsgd", "--model", '{"kind": "mlp"'
    )
    base = base[:-2]  # LiRA: no canaries
    assert "dpsgd is for one-run audits only, not for LiRA" in refusal(
        "--attack", "lira", "--method", "dpsgd", "--dpsgd", '{"epochs": 1}'
    )
