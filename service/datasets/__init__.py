"""Dataset schemas, one module per concept.

- :mod:`service.datasets.tabular`: the tabular kind (schema, validation, encoding).
- :mod:`service.datasets.timeseries`: the time-series kind, built on the tabular pieces.
- :mod:`service.datasets.kinds`: the union of kinds (``DatasetSchema``,
  ``parse_dataset_schema``, ``load_schema_yaml``).

Import from the submodules; this package re-exports nothing.
"""
