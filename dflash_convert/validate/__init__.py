"""Layer 3, validation, as its levels: static (static.py), numeric, end to end, the real engine (engine/) and a
live endpoint (endpoint/); prepare.py reads what a run needs before any slow work, run.py runs the levels in
order, report.py is what they found (report_terminal, report_markdown and report_junit render it). Imports
the format and I/O layers and dflash_runtime.

`from dflash_convert.validate import validate, ValidateOptions` is the library entry point; names load
on first use so that `inspect` (static checks only) never imports torch.
"""

_EXPORTS = {"validate": "run", "validate_output_dir": "run", "ValidateOptions": "options",
            "ValidationReport": "report"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
