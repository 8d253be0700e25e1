"""The gRPC door's own HTTP/2 engine on an asyncio Protocol, header compression by ``hpack``.

``_frames`` (frame layout and limits), ``_stream`` (one stream's state and flow control), ``_connection`` (a
connection: settings, frames in and out, the bounds on what a peer may do). ``--grpc-engine grpcio`` is the
fallback.
"""
