"""The engine level: the pair run by a real serving engine, in-process or in a child process, its figures checked
against our emulation of that engine.

- level.py: the level itself, run after the end-to-end level on the same prompts and sampling;
- served.py: vLLM (`--engine vllm --engine-python PATH`), run by vllm_driver.py in a child process with vLLM's
  own interpreter (standard library and vLLM only: this folder holds no module named as one they import);
- transformers_engine.py: transformers' own speculative generate (`--engine transformers`), in-process.

The live-endpoint client, which measures an engine someone else runs, is the sibling package `endpoint`.
"""
