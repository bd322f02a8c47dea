"""Errors raised by the sans-IO protocol layers."""


class ProtocolError(Exception):
    """The peer sent bytes that break the wire protocol; the connection must be dropped.

    Raised by the decoders in ttrpc.py and mux.py. After it is raised the decoder is
    poisoned: every further call raises the same error, so a caller cannot resynchronise
    on a corrupt byte stream by accident.
    """
