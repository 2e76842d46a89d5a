"""dflash-convert: convert, inspect, validate and ship DFlash speculative-decoding drafts."""

__version__ = "0.1.0"
