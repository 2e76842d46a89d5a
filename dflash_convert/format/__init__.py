"""Layer 1a, the format: what a DFlash draft checkpoint is, stated once as data.

configs (the pydantic config models), mapping (speculators <-> HF key and layer-id table), catalogue
(the tensor catalogue), dtypes (the dtype table), compat (draft/target compatibility rules), engines
(how vLLM, SGLang and z-lab read a config), kinds/ (a draft kind as one unit: its names, keys, tensors, hooks and
engine support, one module per kind and one registry). Imports nothing of dflash_convert but `errors`; no torch.
"""
