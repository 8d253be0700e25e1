"""The data plane against Triton over issue 16's grid: ``python -m loadtests.grid`` (``bench``). The model
repositories (``_models``), one measured point (``_measure``), the tables (``_report``) and the curve (``_plot``;
``bench_grid_curve.png`` is the one the README shows)."""
