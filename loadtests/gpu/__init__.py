"""The GPU path's check and benchmark: ``loadtests/gpu/verify.sh`` runs it all; ``bench_gpu`` prints the table."""
