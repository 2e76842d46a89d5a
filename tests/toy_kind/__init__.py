"""A draft kind defined outside the package, as a plug-in author would: `dflash_bias`, the plain DFlash draft with
one more key and one more tensor. Its format side is one module (dflash_bias.py), its runtime side one module
(dflash_bias_head.py); tests/format/test_kinds.py registers the two in the registries and nothing else."""
