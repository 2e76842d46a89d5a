"""The Hub tests (a package, so that its conftest is not imported as the top-level `conftest` that
other test modules import run_cli from)."""
