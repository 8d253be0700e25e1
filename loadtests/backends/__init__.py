"""MiniLM per backend and precision, in-process and served (issue 15): ``python -m loadtests.backends``
(``bench``). The variants and their parity (``_variants``), a variant's runtime in a process of its own (``_worker``)
and the measurements (``_load``)."""
