"""dflash-convert: convert, inspect, validate and ship DFlash speculative-decoding drafts.

Layers, bottom up; a module imports only from its own layer or below (tests/test_structure.py):
  errors, format/, io/       the checkpoint formats as data, bounded reading, staged writing
  dflash_runtime             the PyTorch DFlash runtime (its own package; imports only the above)
  convert/, validate/, hub/  conversion and diff; validation levels and reports; the Hugging Face Hub
  publish, schemas           pipelines over those (convert -> validate -> push), the JSON schemas
  cli                        the `dflash-convert` command
"""

__version__ = "0.1.0"
