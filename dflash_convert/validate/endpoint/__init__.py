"""The live-endpoint level (`validate --endpoint URL`): a deployment someone else runs, measured over HTTP.

- client.py: the HTTP side (timeouts, the key, TLS, retries) and what the server serves;
- measure.py: the prompts sent and what was served measured;
- counts.py: acceptance as the engine counts it, per request or from its Prometheus counters;
- compare.py: --baseline-endpoint, the same target served without speculation;
- level.py: the level itself, its checks and the report's `endpoint` section.
"""
