"""A long fuzz run: ``python -m loadtests.fuzz`` (``run``). The v2 decoders' strategies and checks (``_protocol``),
the HTTP/2 frame parser (``_h2``), a real modelsvc (``_live``) and the example services' REST APIs (``_services``);
CI runs the same properties briefly (tests/test_fuzz_*.py)."""
