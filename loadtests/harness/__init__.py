"""What the benchmarks share: server processes on free ports (``_servers``: modelsvc, a service's pair, the naive
service, a real Triton; the one server-process harness), load (``_perf``: perf_analyzer or the Python fallback;
``_openloop``: open-loop arrivals for soak and overload), documents (``_documents``), the doc_classifier pair of soak
and overload (``_pair_procs``), a real MLServer (``_mlserver``) and a benchmark's ``__main__`` (``_main``)."""
