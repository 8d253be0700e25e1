"""Our HTTP server against maintained ones on the same data plane (issue 16): ``python -m loadtests.http_servers``
(``bench``). The data plane as ASGI and RSGI apps (``_apps``), one server variant in its own process (``_run``) and
py-spy profiles (``_profile``)."""
