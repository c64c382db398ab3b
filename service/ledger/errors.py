"""The ledger's refusals: exceptions for operations that are refused with nothing written.

A refusal by a privacy filter at admission is :class:`service.ledger.admission.BudgetExceeded`
(it carries the filters' evaluation, so it lives with admission).
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class: a refused ledger operation (a 4xx for the caller, nothing written)."""


class IdempotencyConflict(LedgerError):
    """The Idempotency-Key was used before with a different body."""


class InvalidLedgerOperation(LedgerError):
    pass


class NominalNotAllowed(LedgerError):
    """The dataset does not allow methods whose guarantee is not proven."""
