"""Layer 1b, checkpoint I/O: bounded readers, safetensors headers and copies, the checkpoint as
opened from disk, and staged (all-or-nothing) writes. Imports only `format` and `errors`."""
