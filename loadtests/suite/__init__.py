"""The benchmarks of issue 8, one table of ratios: ``python -m loadtests.suite`` (``bench``). What the rows share
(``_rows``; backends/ and services/ read its statistics too), the pair against the naive service (``_pair``) and
modelsvc alone against its in-process ceiling (``_served``)."""
