"""Selection jobs by concept: the API's bodies and their resolution into a job
(``api_bodies``), the plans of the architecture and hyperparameter kinds and the kind
adapter (``plans``), the per-candidate budget (``budget``), the features kind's request
and plan (``features``), architecture spaces and searches (``search_space``) and the
crossover-ε report (``crossover``). No re-exports: import from the modules."""
