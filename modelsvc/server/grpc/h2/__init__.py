"""The gRPC door's own HTTP/2 engine on an asyncio Protocol, header compression by ``hpack``.

``_frames`` (frame layout and limits), ``_stream`` (one stream's state and flow control), ``_connection`` (a
connection: settings, frames in and out), ``_inflow`` (its receive windows and the process-wide budget) and
``_limits`` (the bounds on what a peer may make the process hold: ``H2Limits``, ``Budget``). ``--grpc-engine
grpcio`` is the fallback.
"""
