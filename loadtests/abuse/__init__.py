"""Abuse of the gRPC port (issue 29): ``python -m loadtests.abuse`` (``bench``) drives each attack (``_attacks``)
against modelsvc's own HTTP/2 engine, modelsvc on grpcio (grpc's C core) and a real Triton 2.51."""
