"""Load tests and benchmarks for modelsvc (see loadtests/README.md)."""
