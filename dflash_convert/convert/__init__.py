"""Layer 3, conversion and comparison: the streaming conversion (one loop over the tensor catalogue)
and `diff`. Imports the format and I/O layers only."""

from dflash_convert.convert.conversion import ConvertOptions, Converted, convert

__all__ = ["ConvertOptions", "Converted", "convert"]
