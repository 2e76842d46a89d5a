"""Will DFlash pay off on a GPU? Plain vs speculative throughput per K and concurrency from the configs alone.

A layer beside the runtime (it imports format, io and errors only), so that validate, the Hub's model card and
the command line can all ask it: gpus (the GPU table), facts (a config.json's dimensions and storage), cost (a
decode step's bytes, FLOPs and time), memory (what one GPU holds: does the deployment fit), calibration (the
measured cases, the fit, the error band), prediction (the rows, the recommendation, the report).
"""
