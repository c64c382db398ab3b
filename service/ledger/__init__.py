"""The privacy ledger: its tables, entries, filters and the operations that change them.

Importing the package installs the automatic refund of a job that failed before it read a
private row (SQLAlchemy event listeners in :mod:`service.ledger.refunds`), so they are in
place wherever the ledger's tables are used.
"""

from service.ledger import refunds as refunds
