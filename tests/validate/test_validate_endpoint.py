"""`validate --endpoint URL` against a fake OpenAI-compatible server (tests/endpoint_server.py): counting from
per-request statistics (vLLM 0.32's and SGLang 0.5.23's shapes, from their protocol code: no SGLang server ran)
and from Prometheus counters, the refusals (foreign traffic, no speculation), the thresholds and reports, and each
fault: one line, exit 1, nothing written. The live vLLM server is in test_validate_endpoint_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from endpoint_server import (Canned, FakeEndpoint, RecordingProxy, models, plain_completion, prometheus, sequence,
                             sglang_chat, vllm_completion)

KEY = "sk-test-never-shown-0123456789"


@pytest.fixture
def server():
    with FakeEndpoint() as fake:
        fake.answer("/v1/models", Canned(body=models("m")))
        yield fake


def _one_error_line(r) -> bool:
    """The failure is the last line of stderr, alone (progress lines come before it)."""
    lines = r.err.strip().splitlines()
    return lines[-1].startswith("Error:") and sum(line.startswith("Error") for line in lines) == 1


def _ids_prompts(tmp_path, n=2):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(" ".join(str(10 + i + j) for j in range(4)) for i in range(n)) + "\n")
    return path


def test_per_request_statistics_counted_exactly(server, tmp_path, cli):
    """Two answers' histograms summed: tau, per-position rates and SGLang's counting follow from them exactly."""
    server.answer("/v1/completions", Canned(body=sequence(vllm_completion([1, 0, 2, 1], tokens=[1] * 9),
                                                          vllm_completion([0, 1, 0, 3], tokens=[2] * 12))))
    r = cli("validate", "--endpoint", server.url + "/v1", "--prompts", _ids_prompts(tmp_path), "--json",
            "--sampling", "greedy", "--max-new-tokens", "12")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    # steps 8; accepted 0*1 + 2*2 + 3*1 + 1*1 + 3*3 = 17; position k: steps accepting more than k
    assert e["counts"] == {"num_drafts": 8, "drafted": 24, "accepted": 17, "acceptance_length": round(1 + 17 / 8, 4),
                           "per_position_rates": [round(7 / 8, 4), round(6 / 8, 4), round(4 / 8, 4)]}
    assert e["accepted_histogram"] == [1, 1, 2, 4]
    assert e["sglang_acceptance_length"] == round(21 / 8, 4)
    assert e["counted"].startswith("per-request")
    assert e["sampling"]["temperature"] == 0.0 and e["sampling"]["top_p"] == "server default"
    sent = [s.body for s in server.seen if s.path == "/v1/completions"]
    assert sent[0]["prompt"] == [10, 11, 12, 13] and sent[0]["return_token_ids"] is True
    assert sent[0]["temperature"] == 0.0 and "top_p" not in sent[0] and sent[0]["max_tokens"] == 12


@pytest.mark.parametrize("per_choice", [False, True], ids=["object", "list"])
def test_sglang_shapes_and_chat_prompts(server, tmp_path, cli, per_choice):
    """Text prompts go to the chat endpoint; SGLang is asked for its details, and counted from them, whether they
    come as one object or as a list with one entry per choice (the tool asks for one)."""
    answer = sglang_chat([1, 2, 0, 3], tokens=[5] * 14, draft_tokens=4)
    if per_choice:
        answer["sglext"]["spec_tokens_details"] = [answer["sglext"]["spec_tokens_details"]]
    server.answer("/v1/models", Canned(body=models("m", owned_by="sglang")))
    server.answer("/v1/chat/completions", Canned(body=answer))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--json")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    assert e["engine"] == "sglang"
    assert e["counts"]["num_drafts"] == 6 and e["counts"]["accepted"] == 11
    assert e["counts"]["per_position_rates"] == [round(5 / 6, 4), 0.5, 0.5]
    body = next(s.body for s in server.seen if s.path == "/v1/chat/completions")
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["return_spec_tokens_details"] is True
    assert "temperature" not in body  # --sampling auto: the server's default
    assert "chat_template_kwargs" not in body
    # --chat-template-kwargs go to the server as its chat endpoint takes them (vLLM's and SGLang's)
    r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--chat-template-kwargs",
            '{"enable_thinking": false}', "--json")
    assert r.code == 0, r.err
    body = [s.body for s in server.seen if s.path == "/v1/chat/completions"][-1]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_counters_summed_over_data_parallel_ranks(server, tmp_path, cli):
    """No per-request statistics: the counters' deltas, summed over both `engine` labels."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5, engines=2)),
                  Canned(body=prometheus(16, 48, 21, [10, 7, 4], done=7, engines=2)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--json")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    assert e["counts"] == {"num_drafts": 6, "drafted": 18, "accepted": 9, "acceptance_length": 2.5,
                           "per_position_rates": [round(4 / 6, 4), 0.5, round(2 / 6, 4)]}
    assert e["counted"].startswith("the deltas") and e["sglang_acceptance_length"] is None


def test_foreign_traffic_refused(server, tmp_path, cli):
    """The request counter moved by more than our 2 requests: no figure is reported as ours."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5)),
                  Canned(body=prometheus(16, 48, 21, [10, 7, 4], done=8)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--junit", tmp_path / "j.xml")
    assert r.code == 1 and r.out == ""
    assert "cannot measure" in r.err and "moved by 3" in r.err and "--per-request-spec-decode-metrics" in r.err
    junit = (tmp_path / "j.xml").read_text()  # CI sees the run end in an error, not a figure of ours
    assert 'errors="1"' in junit and 'failures="0"' in junit and "cannot measure" in junit
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5)),
                  Canned(body=prometheus(16, 48, 21, [10, 7, 4], done=7, running=1)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and "cannot measure" in r.err and "running or waiting" in r.err


@pytest.mark.parametrize("metrics", [b"# no vllm here\n", prometheus(10, 30, 12, [6, 4, 2], done=5)])
def test_endpoint_that_does_not_speculate(server, tmp_path, cli, metrics):
    """No statistics and no counter moved (or none exposed): one line, exit 1."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    server.answer("/metrics", Canned(body=metrics))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and "the endpoint does not speculate" in r.err
    assert _one_error_line(r)


def test_counters_with_steps_but_nothing_accepted_are_a_tau_of_one(server, tmp_path, cli):
    """The counters moved in verify steps and draft tokens, not in accepted tokens: the endpoint speculates and
    accepted nothing (tau 1.0), which is a figure, not "does not speculate"."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5)),
                  Canned(body=prometheus(16, 48, 12, [6, 4, 2], done=7)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--json")
    assert r.code == 0, r.err
    assert r.json()["endpoint"]["counts"] == {"num_drafts": 6, "drafted": 18, "accepted": 0, "acceptance_length": 1.0,
                                              "per_position_rates": [0.0, 0.0, 0.0]}


def test_per_prompt_agreement_compares_accepted_totals_not_only_steps():
    """A request served in as many verify steps as offline but with another accepted total, every offline decision
    clear of a tie, is a disagreement naming the prompt; equal steps and totals agree."""
    from types import SimpleNamespace

    from dflash_convert.validate.endpoint.level import per_prompt_agreement
    from dflash_convert.validate.report import StepDecisions

    clear = [StepDecisions(accepted=[3, 1, 2], margin=[1.0] * 3, next_margin=[1.0] * 3)]
    agrees, detail = per_prompt_agreement([SimpleNamespace(steps=3, accepted=5)], clear)
    assert agrees is False and "prompt 1: served in 3 verify steps with 5 accepted, offline 3 with 6" in detail, detail
    agrees, detail = per_prompt_agreement([SimpleNamespace(steps=3, accepted=6)], clear)
    assert agrees is True and "equal on the 1 prompt(s) compared" in detail, detail


def test_thresholds_reports_and_exit_3(server, tmp_path, cli):
    server.answer("/v1/completions", Canned(body=vllm_completion([3, 1, 0, 0], tokens=[1] * 5)))
    md, junit = tmp_path / "r.md", tmp_path / "r.xml"
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--json",
            "--min-acceptance-length", "2", "--min-position-rates", "0.5,0.1", "--junit", junit, "--report-md", md)
    assert r.code == 3
    failed = r.failed_checks()
    assert set(failed) == {"endpoint_acceptance_length", "endpoint_position_rates"}
    assert "position 1: 0.250 < 0.5" in failed["endpoint_position_rates"]
    assert "endpoint_acceptance_length" in junit.read_text() and "tau 1.25" in md.read_text()
    assert "tau 1.25" in md.with_suffix(".svg").read_text()


def test_regression_gate_between_endpoint_runs(server, tmp_path, cli):
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 0, 0, 50], tokens=[1] * 201)))
    prompts = _ids_prompts(tmp_path)
    first = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--json")
    assert first.code == 0, first.err
    (tmp_path / "base.json").write_text(first.out)
    server.answer("/v1/completions", Canned(body=vllm_completion([30, 10, 5, 5], tokens=[1] * 86)))
    r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--json", "--baseline", tmp_path / "base.json")
    assert r.code == 3 and "regression" in r.failed_checks()
    other = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--baseline", tmp_path / "base.json",
                "--max-new-tokens", "9")
    assert other.code == 1 and "sent other requests" in other.err


def test_model_choice(server, tmp_path, cli):
    server.answer("/v1/models", Canned(body=models("a", "b")))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 2 and "2 models (a, b)" in r.err and "--endpoint-model" in r.err
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--endpoint-model", "c")
    assert r.code == 1 and "does not serve 'c'" in r.err
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--endpoint-model", "b")
    assert r.code == 0 and {s.body["model"] for s in server.seen if s.path == "/v1/completions"} == {"b"}


def test_key_from_the_named_variable_never_shown(server, tmp_path, cli, monkeypatch):
    """The key goes in the header to the endpoint; a 401 names the variable, never the key."""
    monkeypatch.setenv("STAGING_KEY", KEY)
    server.answer("/v1/models", Canned(401, {"error": {"message": f"bad key {KEY}"}}))
    r = cli("validate", "--endpoint", server.url, "--endpoint-key-env", "STAGING_KEY")
    assert r.code == 1 and "$STAGING_KEY was refused" in r.err and "HTTP 401" in r.err
    assert KEY not in r.err + r.out
    assert server.seen[-1].headers["Authorization"] == f"Bearer {KEY}"
    server.answer("/v1/models", Canned(body=models("m")))
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
    r = cli("validate", "--endpoint", server.url, "--endpoint-key-env", "STAGING_KEY", "--prompts",
            _ids_prompts(tmp_path), "--json", "--report-md", tmp_path / "r.md")
    assert r.code == 0 and KEY not in r.out + r.err + (tmp_path / "r.md").read_text()


def test_redirect_to_another_host_gets_no_key(server, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeEndpoint() as elsewhere:
        elsewhere.answer("/v1/models", Canned(body=models("m")))
        server.answer("/v1/models", Canned(307, b"", headers={"Location": elsewhere.url + "/v1/models"}))
        r = cli("validate", "--endpoint", server.url)
        assert r.code == 1 and "redirected (HTTP 307)" in r.err and "not followed" in r.err
        assert elsewhere.seen == [] and KEY not in r.err


@pytest.mark.parametrize(("canned", "said"), [
    (Canned(404, {"error": {"message": "The model `m` does not exist."}}), "HTTP 404 (not found: The model"),
    (Canned(200, b"<html>gateway</html>", headers={"Content-Type": "text/html"}), "not JSON (content-type text/html"),
    (Canned(200, {"choices": []}), "lacks the field `choices.0`"),
    (Canned(200, {"choices": [{"text": "x"}], "usage": {}}), "lacks the field `usage.completion_tokens`"),
    (Canned(200, plain_completion([1] * 40), cut=True), "cut short"),
    (Canned(500, {"error": {"message": "engine dead"}}), "HTTP 500: engine dead"),
])
def test_bad_answers_one_line(server, tmp_path, cli, canned, said):
    server.answer("/v1/completions", canned)
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and said in r.err and r.out == "", r.err
    assert _one_error_line(r) and "Traceback" not in r.err


def test_retry_after_capped(server, tmp_path, cli, monkeypatch):
    """429 then 503 with Retry-After: waited (an hour capped to the cap), then answered."""
    from dflash_convert.validate.endpoint import client as endpoint

    waits = []
    monkeypatch.setattr(endpoint.time, "sleep", waits.append)
    server.answer("/v1/completions", Canned(429, {}, headers={"Retry-After": "3600"}),
                  Canned(503, {}, headers={"Retry-After": "2"}), Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path, n=1))
    assert r.code == 0, r.err
    assert waits == [endpoint.RETRY_AFTER_CAP_S, 2.0]
    server.answer("/v1/completions", Canned(503, {"error": {"message": "overloaded"}}))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path, n=1))
    assert r.code == 1 and "HTTP 503: overloaded" in r.err


HANG_S = 120  # the server does not answer for longer than the bound allows; it lets go when the fixture stops it
TIMEOUT_S = 2
MARGIN_S = 60  # start-up on a loaded machine; below the hang, so a run that waited for the server fails


def test_hanging_server_bounded(server, tmp_path, cli):
    """A server that takes the requests and never answers: the run ends within --endpoint-timeout plus a margin,
    exit 1, one line naming the timeout (whichever wait it ended in: the read, the whole measurement, or a
    deadline already past when a request was to be sent on a busy machine)."""
    import time

    server.answer("/v1/completions", Canned(body=plain_completion([1]), hang_s=HANG_S))
    started = time.monotonic()
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path, n=2), "--endpoint-timeout",
            str(TIMEOUT_S))
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT_S + MARGIN_S, elapsed
    assert r.code == 1 and r.out == "" and _one_error_line(r), r.err
    assert "--endpoint-timeout" in r.err and f"{TIMEOUT_S} s" in r.err, r.err


def test_unreachable_and_bad_urls(cli):
    r = cli("validate", "--endpoint", "http://127.0.0.1:9")
    assert r.code == 1 and "cannot connect" in r.err
    r = cli("validate", "--endpoint", "ftp://x")
    assert r.code == 2 and "http:// or https://" in r.err
    r = cli("validate", "--endpoint", f"http://user:{KEY}@127.0.0.1:9")
    assert r.code == 2 and KEY not in r.err
    r = cli("validate")
    assert r.code == 2 and "--endpoint" in r.err


def test_tls_verified_against_named_bundle(tmp_path, cli, monkeypatch):
    """A self-signed server: refused as unverified; trusted once SSL_CERT_FILE names its certificate."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with FakeEndpoint() as fake:
        fake.answer("/v1/models", Canned(body=models("m")))
        fake.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        fake.httpd.socket = context.wrap_socket(fake.httpd.socket, server_side=True)
        url = fake.url.replace("http://", "https://")
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        r = cli("validate", "--endpoint", url, "--prompts", _ids_prompts(tmp_path, n=1))
        assert r.code == 1 and "TLS certificate not verified" in r.err
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
        r = cli("validate", "--endpoint", url, "--prompts", _ids_prompts(tmp_path, n=1))
        assert r.code == 0, r.err


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                   "no_proxy")


def _proxied(monkeypatch, proxy_url, no_proxy=None):
    """Every proxy variable set to `proxy_url` (NO_PROXY to `no_proxy`, else unset)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in PROXY_VARIABLES[:6]:
        monkeypatch.setenv(name, proxy_url)
    if no_proxy is not None:
        monkeypatch.setenv("NO_PROXY", no_proxy)


def test_proxy_variables_tunnel_https_and_never_see_the_key(server, tmp_path, cli, monkeypatch):
    """Behind a proxy: an https:// endpoint is reached through a CONNECT tunnel to its host and port (the key inside
    TLS, never in a byte the proxy reads); NO_PROXY naming the host goes directly; a plain http:// endpoint is
    reached directly whatever the variables say (a proxy would read its key)."""
    import ssl
    import subprocess

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    prompts = _ids_prompts(tmp_path, n=1)
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
    with RecordingProxy() as proxy:
        _proxied(monkeypatch, proxy.url)
        r = cli("validate", "--endpoint", server.url, "--prompts", prompts)
        assert r.code == 0, r.err
        assert proxy.received == [] and server.seen[-1].headers["Authorization"] == f"Bearer {KEY}"

        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        with FakeEndpoint() as tls:
            tls.answer("/v1/models", Canned(body=models("m")))
            tls.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            tls.httpd.socket = context.wrap_socket(tls.httpd.socket, server_side=True)
            url, port = tls.url.replace("http://", "https://"), tls.httpd.server_address[1]
            monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
            r = cli("validate", "--endpoint", url, "--prompts", prompts)
            assert r.code == 0, r.err
            assert proxy.heads() and set(proxy.heads()) == {f"CONNECT 127.0.0.1:{port} HTTP/1.1"}
            assert not any(KEY.encode() in bytes(b) for b in proxy.received)
            assert tls.seen and all(s.headers["Authorization"] == f"Bearer {KEY}" for s in tls.seen)
            tunnelled = len(proxy.received)
            _proxied(monkeypatch, proxy.url, no_proxy=f"localhost,127.0.0.1:{port}")
            r = cli("validate", "--endpoint", url, "--prompts", prompts)
            assert r.code == 0 and len(proxy.received) == tunnelled, r.err  # directly
            # a proxy that cannot be reached: one line naming it, never its credentials
            _proxied(monkeypatch, "http://user:proxy-secret@127.0.0.1:9")
            r = cli("validate", "--endpoint", url, "--prompts", prompts)
            assert r.code == 1 and "cannot connect (through the proxy 127.0.0.1:9 (from $HTTPS_PROXY))" in r.err
            assert "proxy-secret" not in r.err and _one_error_line(r)
            _proxied(monkeypatch, "socks5://127.0.0.1:9")  # not a proxy httpx tunnels without an extra
            r = cli("validate", "--endpoint", url, "--prompts", prompts)
            assert r.code == 2 and "$HTTPS_PROXY: give an http:// proxy" in r.err, r.err


def test_concurrency_in_flight(server, tmp_path, cli):
    """--concurrency 4: four requests are answered together (each holds its answer a moment)."""
    import threading

    inside, most, lock = [0], [0], threading.Lock()

    def answer(_body):
        import time

        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.3)
        with lock:
            inside[0] -= 1
        return vllm_completion([0, 2], tokens=[1] * 5)

    server.answer("/v1/completions", Canned(body=answer))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path, n=8), "--concurrency", "4")
    assert r.code == 0, r.err
    assert most[0] == 4


def _with_top(answer: dict, tops: list[dict[str, float]]) -> dict:
    """A completion answer with vLLM's top candidates per token (return_tokens_as_token_ids)."""
    answer["choices"][0]["logprobs"] = {"top_logprobs": [{f"token_id:{t}": v for t, v in step.items()}
                                                         for step in tops]}
    return answer


@pytest.mark.parametrize(("other_logit", "passes"), [(9.99, True), (7.0, False)])
def test_baseline_endpoint_outputs_judged_at_near_ties(server, tmp_path, cli, other_logit, passes):
    """Outputs parting at token 3: a near-tie by the baseline's logits passes (and is named), else the prompt,
    the position and both tokens are named and the run fails."""
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 3], tokens=[5, 6, 8, 9])))
    with FakeEndpoint() as plain:
        plain.answer("/v1/models", Canned(body=models("m")))
        tops = [{5: 10.0}, {6: 10.0}, {7: 10.0, 8: other_logit}, {9: 10.0}]
        plain.answer("/v1/completions", Canned(body=_with_top(plain_completion([5, 6, 7, 9]), tops)))
        r = cli("validate", "--endpoint", server.url, "--baseline-endpoint", plain.url, "--prompts",
                _ids_prompts(tmp_path, n=1), "--sampling", "greedy", "--json")
        sent = [s.body for s in plain.seen if s.path == "/v1/completions"]
    assert r.code == (0 if passes else 3), r.err
    b = r.json()["endpoint"]["baseline_endpoint"]
    assert b["rounds"] == 3 and len(sent) == 3 and sent[0]["logprobs"] == 5 and sent[0]["return_tokens_as_token_ids"]
    if passes:
        assert b["outputs_equal"] == 0
        assert "token 3: the baseline took 7, the speculative endpoint 8" in b["near_ties"][0]
    else:
        message = r.failed_checks()["endpoint_outputs_equal"]
        assert "prompt 1: the deployment's speculation changes its output (token 3: the baseline took 7, the " \
               "speculative endpoint 8 (values 10 and 7: not a near-tie))" in message


@pytest.mark.parametrize(("spec_token_3", "code", "says"), [
    # the speculative server's verify row puts 8 an ulp over 7: its computation moved the gap 0.375 = 6 ulps, and
    # its rounding before moved token 2's logit by 0.125 (2 ulps): a gap of 4 ulps is within twice that
    ({8: 9.875, 7: 9.75, "prefix": 9.875}, 0, "the speculative endpoint computes them 9.75 and 9.875: the "
     "computations moved the gap by 0.375 = 6.0 ulps"),
    # the same row, but the two servers computed the tokens before alike: nothing measured explains 4 ulps (the
    # speculative server's own row always orders the two its way)
    ({8: 9.875, 7: 9.75}, 3, "the runs' rounding before it moved a logit by 0 at most: not a near-tie"),
    # its row computes them as the baseline did: it took 8 where its own logits put 7 4 ulps above
    ({7: 10.0, 8: 9.75}, 3, "the computations moved the gap by 0 = 0.0 ulps (largest logit move 0); the runs' "
     "rounding before it moved a logit by 0 at most: not a near-tie"),
    # no candidates from the speculative server: nothing measured, and 4 ulps are over the 2-ulp floor
    (None, 3, "(values 10 and 9.75: not a near-tie)"),
    # log-probabilities (a server without --logprobs-mode processed_logits): not measured, the floor alone
    ({8: -0.5, 7: -0.75}, 3, "(values 10 and 9.75: not a near-tie)"),
])
def test_baseline_parting_judged_by_the_servers_measured_noise(server, tmp_path, cli, spec_token_3, code, says):
    """Outputs parting at token 3, 4 bf16 ulps apart by the baseline's logits (wider than the 2-ulp floor): a
    near-tie where the speculative server's own reported logits moved the gap that far and the servers' rounding
    on the tokens before is wide enough to explain it; a failure where either is missing, or where nothing was
    measured. A fixed 2-ulp rule fails the first case."""
    spec_tops = None
    if spec_token_3 is not None:
        row = {t: v for t, v in spec_token_3.items() if t != "prefix"}
        spec_tops = [{5: 10.0}, {6: spec_token_3.get("prefix", 10.0)}, row, {9: 10.0}]
    spec = vllm_completion([0, 3], tokens=[5, 6, 8, 9])
    server.answer("/v1/completions", Canned(body=_with_top(spec, spec_tops) if spec_tops else spec))
    with FakeEndpoint() as plain:
        plain.answer("/v1/models", Canned(body=models("m")))
        tops = [{5: 10.0}, {6: 10.0}, {7: 10.0, 8: 9.75}, {9: 10.0}]
        plain.answer("/v1/completions", Canned(body=_with_top(plain_completion([5, 6, 7, 9]), tops)))
        r = cli("validate", "--endpoint", server.url, "--baseline-endpoint", plain.url, "--prompts",
                _ids_prompts(tmp_path, n=1), "--sampling", "greedy", "--json")
    assert r.code == code, r.err
    b = r.json()["endpoint"]["baseline_endpoint"]
    message = b["near_ties"][0] if code == 0 else r.failed_checks()["endpoint_outputs_equal"]
    assert "token 3: the baseline took 7, the speculative endpoint 8" in message and says in message, message


def test_ctrl_c_cancels_in_flight_requests(server, tmp_path):
    """Ctrl-C while requests hang on the server: exit 130 at once (nothing waits for their answers)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from processes import ROOT, stop_signals_at_default

    server.answer("/v1/completions", Canned(body=plain_completion([1]), hang_s=60))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]))
    child = subprocess.Popen([sys.executable, "-m", "dflash_convert", "validate", "--endpoint", server.url,
                              "--prompts", str(_ids_prompts(tmp_path, n=4)), "--concurrency", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=stop_signals_at_default)
    deadline = time.monotonic() + 60
    while sum(s.path == "/v1/completions" for s in server.seen) < 2:
        assert time.monotonic() < deadline and child.poll() is None, child.communicate()
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=20)
    assert child.returncode == 130, err
    assert "Traceback" not in err


def test_model_card_shows_the_served_figures(server, tmp_path, cli):
    """push --validation-report with an endpoint report: the card says what the deployment served."""
    from pathlib import Path

    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate.report import ValidationReport

    server.answer("/v1/completions", Canned(body=vllm_completion([1, 0, 2, 1], tokens=[1] * 9)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--json")
    summary = ValidationReport.model_validate(r.json()).summary().model_dump(mode="json")
    assert summary["endpoint"]["per_request"] == []
    pair = Path(__file__).resolve().parents[2] / "examples" / "pair" / "draft"
    card = model_card(open_checkpoint(pair).spec, repo_id="org/d", validation=summary)
    assert "Served by vllm (model `m`, measured over HTTP): tau 2.75 in vLLM's counting over 8 verify steps" in card


def test_figures_per_prompt_set_through_the_library(server):
    """Named prompt sets (--dataset) are measured together and reported each on its own."""
    from dflash_convert.validate import ValidateOptions, validate
    from dflash_convert.validate.options import PromptSet

    server.answer("/v1/completions", Canned(body=lambda body: vllm_completion(
        [0, 0, 2] if body["prompt"][0] == 1 else [2, 0, 0], tokens=[1, 2])))
    report = validate(None, ValidateOptions(endpoint=server.url, prompts=[[1, 5]], prompt_sets=[
        PromptSet(name="easy", source="here", prompts=[[1, 2], [1, 3]]),
        PromptSet(name="hard", source="here", prompts=[[9, 9]])]))
    sets = report.endpoint.per_prompt_set
    assert (sets["easy"].prompts, sets["easy"].acceptance_length, sets["easy"].source) == (2, 3.0, "here")
    assert (sets["hard"].prompts, sets["hard"].acceptance_length) == (1, 1.0)
    assert report.endpoint.counts.num_drafts == 8 and report.endpoint.prompts == 4


def test_counters_that_cannot_be_read(server, tmp_path, cli):
    """No per-request statistics and /metrics absent (a router): cannot measure, saying why; with per-request
    statistics the counters are not needed."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and "cannot measure" in r.err and "HTTP 404" in r.err and _one_error_line(r)
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 2], tokens=[1] * 5)))
    assert cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path)).code == 0


def test_each_request_grouped_by_category_and_prompt_length(server, tmp_path, cli):
    """Per-request statistics grouped by the prompts' `category` and by the prompt length the server counted."""
    def answer(body):
        reply = vllm_completion([0, 0, 2] if body["prompt"][0] == 1 else [2, 0, 0], tokens=[1, 2])
        reply["usage"]["prompt_tokens"] = len(body["prompt"])
        return reply

    server.answer("/v1/completions", Canned(body=answer))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in
                               [([1] * 5, "code"), ([2] * 1500, "prose"), ([1] * 2000, "code")]))
    r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--min-acceptance-length", "1", "--json")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    assert {k: (v["prompts"], v["acceptance_length"]) for k, v in e["per_category"].items()} == {
        "code": (2, 3.0), "prose": (1, 1.0)}
    assert {k: (v["prompts"], v["acceptance_length"]) for k, v in e["per_prompt_length"].items()} == {
        "<1024": (1, 3.0), "1024-2047": (2, 2.0)}
    assert "category code: tau 3.00 over 2 prompts" in r.err


def _by_length(taus: dict[int, list[int]], short: list[int], per_step: bool = False):
    """An answer whose histogram depends on the prompt's length (`taus`: length -> histogram; else `short`), its
    usage.prompt_tokens that length, as vLLM counts a prompt of token ids."""
    def answer(body):
        n = len(body["prompt"])
        hist = taus.get(n, short)
        steps = [a for a, h in enumerate(hist) for _ in range(h)]
        made = len(steps) + sum(steps)
        reply = vllm_completion(hist, tokens=[7] * min(made, body["max_tokens"]), per_step=steps if per_step else None)
        reply["usage"]["prompt_tokens"] = n
        reply["choices"][0]["finish_reason"] = "length" if made >= body["max_tokens"] else "stop"
        return reply
    return answer


def test_context_lengths_cut_with_the_servers_tokenizer(server, tmp_path, cli):
    """--context-lengths against --endpoint: prompts of exactly L tokens of the server's own tokenizer (/tokenize,
    as vLLM answers it), cut from the text as the runtime cuts it, sent as token ids; each length's figures are
    its requests' own counts, and the curve, the half-tau length and the check are reported as the runtime's."""
    from endpoint_server import char_tokenize, vllm_tokenize

    from dflash_convert.validate.breakdown import long_contexts

    server.answer("/tokenize", Canned(body=vllm_tokenize))
    server.answer("/v1/completions", Canned(body=_by_length({64: [0, 3, 0], 128: [3, 0, 0]}, [0, 0, 3])))
    doc = tmp_path / "doc.md"
    doc.write_text("A design document, long enough for four windows of each length. " * 9)
    report = tmp_path / "r.md"
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "64,128",
            "--long-context-file", doc, "--max-new-tokens", "8", "--report-md", report, "--json")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    assert [(s["context_tokens"], s["prompts"], s["num_drafts"], s["acceptance_length"])
            for s in e["per_context_length"]] == [(64, 4, 12, 2.0), (128, 4, 12, 1.0)]
    assert e["counts"]["acceptance_length"] == 3.0 and e["context_half_tau_length"] == 128
    assert "cut with the server's own tokenizer" in e["context_source"] and "sent to" in e["context_source"]
    check = next(c for c in r.json()["checks"] if c["name"] == "endpoint_context_lengths")
    assert check["status"] == "warn" and "below half the short-context tau from 128 tokens" in check["message"]
    # exactly the windows the runtime cuts from the text with the same tokenizer, BOS first
    def tokenizer(text, add_special_tokens=True):
        return {"input_ids": char_tokenize(text, add_special_tokens)}
    want = long_contexts([64, 128], doc, tokenizer, None, [], 1 << 20).windows
    sent = [s.body["prompt"] for s in server.seen if s.path == "/v1/completions" and len(s.body["prompt"]) > 4]
    assert sent == want[64] + want[128] and all(p[0] == 1 for p in sent)
    asked = [s.body for s in server.seen if s.path == "/tokenize"]
    assert asked[0] == {"model": "m", "prompt": "", "add_special_tokens": True}
    assert asked[1]["add_special_tokens"] is False and asked[1]["prompt"] == doc.read_text()
    md = report.read_text()
    assert "### tau against context length at" in md and "tau falls below half its short-context value (1.50) at " \
        "128 tokens" in md and (tmp_path / "r-context-length.svg").exists()
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "64,128",
            "--long-context-file", doc, "--max-new-tokens", "8")
    assert "tau falls below half its short-context value (1.50) at 128 tokens" in r.out


def test_context_lengths_counted_per_phase_from_counters(server, tmp_path, cli):
    """Without per-request statistics each length's requests are their own phase, counted from the counters'
    deltas around it (nothing else ran), exactly."""
    server.answer("/v1/completions", Canned(body=lambda body: plain_completion([1] * 4) | {
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 4}}))
    server.answer("/metrics", Canned(body=prometheus(0, 0, 0, [0, 0], 0)),
                  Canned(body=prometheus(4, 8, 6, [4, 2], 2)),  # the run's 2 prompts: tau 2.5
                  Canned(body=prometheus(4, 8, 6, [4, 2], 2)),
                  Canned(body=prometheus(8, 16, 7, [5, 2], 3)),  # the 1 prompt of 8 tokens: tau 1.25
                  Canned(body=prometheus(8, 16, 7, [5, 2], 3)),
                  Canned(body=prometheus(10, 20, 11, [7, 4], 4)))  # the 1 prompt of 12 tokens: tau 3
    ids = tmp_path / "long.txt"
    ids.write_text(" ".join(str(5 + i) for i in range(12)) + "\n")
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "8,12",
            "--long-context-file", ids, "--max-new-tokens", "4", "--json")
    assert r.code == 0, r.err
    assert [(s["context_tokens"], s["prompts"], s["num_drafts"], s["acceptance_length"], s["per_position_rates"])
            for s in r.json()["endpoint"]["per_context_length"]] == [(8, 1, 4, 1.25, [0.25, 0.0]),
                                                                     (12, 1, 2, 3.0, [1.0, 1.0])]
    assert [x.body["prompt"] for x in server.seen if x.path == "/v1/completions"][-2:] == [list(range(5, 13)),
                                                                                           list(range(5, 17))]


def test_context_lengths_beyond_the_served_context_refused(server, tmp_path, cli):
    """A length that with its new tokens passes the max_model_len /v1/models gives: exit 2 naming both numbers,
    before anything is generated."""
    server.answer("/v1/models", Canned(body=models("m", max_model_len=100)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "96",
            "--max-new-tokens", "8")
    assert r.code == 2 and "96 + --max-new-tokens 8 = 104 tokens exceeds the max_model_len 100" in r.err
    assert _one_error_line(r) and not [s for s in server.seen if s.path != "/v1/models"]
    # a card without max_model_len: an answer ended for length short of the tokens asked is the context's limit
    server.answer("/v1/models", Canned(body=models("m")))
    server.answer("/v1/completions", Canned(body=lambda body: vllm_completion([1, 1, 0], tokens=[3] * 3) | {
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3}}))
    doc = tmp_path / "ids.txt"
    doc.write_text(" ".join(map(str, range(3, 200))) + "\n")
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "96",
            "--long-context-file", doc, "--max-new-tokens", "8")
    assert r.code == 1 and "got 3 of --max-new-tokens 8 tokens, ended for length" in r.err and _one_error_line(r)


def test_context_lengths_without_a_tokenizer(server, tmp_path, cli):
    """No /tokenize (a router) and no local --target: exit 1 saying what to give, nothing generated; a
    --long-context-file of token ids needs no tokenizer."""
    doc = tmp_path / "doc.md"
    doc.write_text("plain prose " * 40)
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "16",
            "--long-context-file", doc)
    assert r.code == 1 and "no tokenizer to cut prompts of exact lengths" in r.err and "give --target DIR" in r.err
    assert _one_error_line(r) and not [s for s in server.seen if s.path == "/v1/completions"]
    server.answer("/v1/completions", Canned(body=_by_length({16: [1, 1, 0]}, [0, 0, 3])))
    doc.write_text(" ".join(map(str, range(3, 40))) + "\n")
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "16",
            "--long-context-file", doc, "--json")
    assert r.code == 0, r.err
    assert r.json()["endpoint"]["per_context_length"][0]["acceptance_length"] == 1.5
    # a local --target directory's tokenizer cuts a text (its word `t<i>` is id i, no BOS)
    from factories import token_words_target

    target = token_words_target(Path(__file__).resolve().parents[2] / "examples" / "pair" / "target",
                                tmp_path / "target")
    doc.write_text(" ".join(f"t{i}" for i in range(100, 140)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "16",
            "--long-context-file", doc, "--target", target, "--json")
    assert r.code == 0, r.err
    assert "the local tokenizer of --target" in r.json()["endpoint"]["context_source"]
    sent = [s.body["prompt"] for s in server.seen if s.path == "/v1/completions"][-2:]
    assert sent == [list(range(100, 116)), list(range(116, 132))]


def test_category_gates_and_output_buckets(server, tmp_path, cli):
    """--min-acceptance-length CATEGORY=X gates each category's requests at the endpoint (exit 3 below it); a gate
    naming a category no prompt carries, or one the counters cannot split, is an error; vLLM's per-step lists
    (detailed) group the verify steps by the output position they began at."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in
                               [([1] * 5, "code"), ([2] * 6, "prose")]))
    server.answer("/v1/completions", Canned(body=_by_length({5: [0, 0, 40]}, [30, 10, 0], per_step=True)))
    args = ("validate", "--endpoint", server.url, "--prompts", prompts, "--max-new-tokens", "200", "--json")
    r = cli(*args, "--min-acceptance-length", "code=2.5")
    assert r.code == 0, r.err
    gate = next(c for c in r.json()["checks"] if c["name"] == "endpoint_acceptance_length[code]")
    assert gate["status"] == "pass" and gate["value"] == 3.0
    buckets = r.json()["endpoint"]["per_output_bucket"]
    # code: 40 steps of 2 accepted begin at positions 1, 4, ..., 61 (21) then 64, ..., 118 (19); prose: 30 steps of
    # 0 at 1..30, then 10 of 1 at 31, 33, ..., 49
    assert [(b["label"], b["num_drafts"], b["accepted"]) for b in buckets] == [("0-64", 61, 52), ("64-", 19, 38)]
    r = cli(*args, "--min-acceptance-length", "prose=1.5")
    assert r.code == 3 and any(c["name"] == "endpoint_acceptance_length[prose]" and c["status"] == "fail"
                               for c in r.json()["checks"])
    r = cli(*args, "--min-acceptance-length", "math=1")
    assert r.code == 2 and "'math', which no prompt in" in r.json()["error"]["message"]  # a usage error, as end to end
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 4)))
    server.answer("/metrics", Canned(body=prometheus(0, 0, 0, [0, 0], 0)), Canned(body=prometheus(4, 8, 6, [4, 2], 2)))
    r = cli(*args, "--min-acceptance-length", "code=1")
    assert r.code == 1 and "cannot gate category code" in r.json()["error"]["message"]


def test_context_lengths_at_the_endpoint_equal_the_runtimes_on_the_same_pair(server):
    """A CHECKPOINT with --target: the endpoint is sent the very windows the end-to-end level decoded, and a server
    that serves the pair exactly (here the runtime itself, counted as vLLM counts: full last blocks) gives each
    length the tau the runtime counted as vLLM counts."""
    import torch

    from dflash_runtime import Sampling, load_draft, load_target, speculative_generate

    from dflash_convert.validate.breakdown import half_tau_length
    from dflash_convert.validate.options import ValidateOptions
    from dflash_convert.validate.run import validate

    pair = Path(__file__).resolve().parents[2] / "examples" / "pair"
    draft = load_draft(pair / "draft", dtype=torch.float32)
    target = load_target(pair / "target", dtype=torch.float32)
    stop = Sampling(stop_token_ids=(510,))  # the target's generation_config eos, as validate stops at it
    served: dict[int, list[list[int]]] = {}

    def serve(body):
        g = speculative_generate(draft, target, body["prompt"], max_new_tokens=body["max_tokens"], sampling=stop,
                                 full_last_block=True)
        hist = [g.accepted_per_step.count(a) for a in range(16)]
        served.setdefault(len(body["prompt"]), []).append(body["prompt"])
        reply = vllm_completion(hist, tokens=g.tokens, per_step=g.accepted_per_step)
        reply["usage"]["prompt_tokens"] = len(body["prompt"])
        return reply

    server.answer("/v1/completions", Canned(body=serve))
    prompts = [[int(t) for t in line.split()] for line in (pair / "prompts.txt").read_text().splitlines()[:1]]
    report = validate(pair / "draft", ValidateOptions(
        target=pair / "target", endpoint=server.url, prompts=prompts, levels=["static", "end_to_end"],
        max_new_tokens=16, sampling="greedy", timing_rounds=1, dtype="float32", context_lengths=[96, 160]))
    a, e = report.acceptance, report.endpoint
    assert [s.context_tokens for s in e.per_context_length] == [96, 160]
    assert [(s.num_drafts, s.accepted, s.acceptance_length) for s in e.per_context_length] == \
        [(s.num_drafts, s.accepted, s.acceptance_length) for s in a.vllm_context_counting]
    assert served[96] and all(len(p) == 96 for p in served[96]) and len(served[160]) == e.per_context_length[1].prompts
    assert e.context_half_tau_length == half_tau_length(e.counts.acceptance_length, e.per_context_length)
    assert "token ids joined in order" in e.context_source and "sent to" in e.context_source


def _edited(histogram: list[int], tokens: int, edit) -> dict:
    """A vLLM answer with per-request statistics, then `edit(spec, answer)` applied to it."""
    answer = vllm_completion(histogram, tokens=[7] * tokens)
    edit(answer["metrics"]["speculative_decoding"], answer)
    return answer


SPEC = "metrics.speculative_decoding"


@pytest.mark.parametrize(("answer", "said"), [
    # 12 accepted of 8 drafted: tau 4 at K=2; a --min-acceptance-length 3.5 gate passed on it
    (_edited([-1, 0, 3], 9, lambda s, a: s.update(num_spec_steps=2, num_draft_tokens=8)),
     f"{SPEC}.acceptance_histogram[0] is -1, a negative count"),
    (_edited([0, 0, 3], 9, lambda s, a: s.update(num_draft_tokens=4)),
     f"6 accepted draft tokens ({SPEC}.num_accepted_draft_tokens) exceed the 4 drafted ({SPEC}.num_draft_tokens)"),
    (_edited([0, 0, 0, 0, 0, 3], 9, lambda s, a: s.update(num_spec_tokens=2, num_draft_tokens=6)),
     f"{SPEC}.acceptance_histogram has 6 entries, at most 3 at 2 draft tokens per verify step "
     f"({SPEC}.num_spec_tokens)"),
    (_edited([0, 0, 3], 9, lambda s, a: s.update(acceptance_histogram=[0, 0, 3.5])),
     f"{SPEC}.acceptance_histogram[2] is 3.5, not a whole count"),
    (_edited([0, 0, 3], 9, lambda s, a: s.update(num_spec_steps="3")),
     f"{SPEC}.num_spec_steps is '3', not a whole count"),
    (_edited([0, 0, 3], 9, lambda s, a: s.update(num_draft_tokens=-6)),
     f"{SPEC}.num_draft_tokens is -6, a negative count"),
    (_edited([0, 0, 3], 1, lambda s, a: None),
     f"usage.completion_tokens is 1, fewer than the 3 verify steps ({SPEC}.num_spec_steps): each step commits at "
     "least one token"),
    (_edited([0, 0, 3], 9, lambda s, a: s.update(per_step_accepted=[2, 2, 3])),
     f"{SPEC}.per_step_accepted[2] is 3, more than the 2 draft tokens of a verify step ({SPEC}.num_spec_tokens)"),
], ids=["negative", "accepted-over-drafted", "histogram-past-K", "fraction", "string", "negative-drafted",
        "tokens-under-steps", "per-step-past-K"])
def test_impossible_per_request_counts_are_an_error_never_a_verdict(server, tmp_path, cli, answer, said):
    """Counts a server answered that cannot be: exit 1, one line naming the URL, the answer and the field, whether
    the gate would have passed or failed on them (never exit 0 or 3)."""
    server.answer("/v1/completions", Canned(body=answer))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--max-new-tokens", "9",
            "--min-acceptance-length", "2")
    assert r.code == 1 and r.out == "", r.err
    assert r.err.strip().splitlines()[-1] == \
        f"Error: --endpoint {server.url}/v1/completions, the answer to prompt 1: impossible counts: {said}"


def test_impossible_sglang_counts_and_a_run_of_no_verify_step(server, tmp_path, cli):
    """SGLang's details go through the same gate; answers whose statistics count 0 verify steps are no tau 1.00."""
    answer = sglang_chat([0, 0, 3], tokens=[5] * 9, draft_tokens=3)
    answer["sglext"]["spec_tokens_details"]["spec_num_correct_drafts"] = 7
    answer["sglext"]["spec_tokens_details"]["spec_correct_drafts_histogram"] = [0, 0, 2, 1]
    server.answer("/v1/models", Canned(body=models("m", owned_by="sglang")))
    server.answer("/v1/chat/completions", Canned(body=answer))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    r = cli("validate", "--endpoint", server.url, "--prompts", prompts)
    details = "sglext.spec_tokens_details"
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: --endpoint {server.url}/v1/chat/completions, the answer to prompt 1: impossible counts: "
        f"{details}.spec_correct_drafts_histogram has 4 entries, at most 3 at 2 draft tokens per verify step "
        f"({details}.spec_num_proposed_drafts / spec_verify_ct)")
    server.answer("/v1/models", Canned(body=models("m")))
    server.answer("/v1/completions", Canned(body=vllm_completion([0, 0, 0], tokens=[7] * 4)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: --endpoint {server.url}: cannot measure: the 2 answer(s) carried per-request statistics of 0 verify "
        "steps: nothing was speculated, no tau to report")


@pytest.mark.parametrize(("after", "said"), [
    (prometheus(8, 24, 12, [6, 4, 2], done=7),
     "the delta of vllm:spec_decode_num_drafts_total is -2, a negative count"),
    (prometheus(16, 33, 21, [10, 7, 4], done=7),
     "9 accepted draft tokens (the delta of vllm:spec_decode_num_accepted_tokens_total) exceed the 3 drafted (the "
     "delta of vllm:spec_decode_num_draft_tokens_total)"),
    (prometheus(16, 48, 21, [17, 7, 4], done=7),
     "the delta of vllm:spec_decode_num_accepted_tokens_per_pos_total[0] is 11, more than the 6 verify steps (the "
     "delta of vllm:spec_decode_num_drafts_total)"),
    (prometheus(40, 120, 21, [10, 7, 4], done=7),
     "the answers' usage.completion_tokens summed is 16, fewer than the 30 verify steps (the delta of "
     "vllm:spec_decode_num_drafts_total): each step commits at least one token"),
], ids=["went-back", "accepted-over-drafted", "position-over-steps", "tokens-under-steps"])
def test_impossible_counter_deltas_are_an_error(server, tmp_path, cli, after, said):
    """The counters' deltas pass the same gate as per-request statistics, naming the metric."""
    server.answer("/v1/completions", Canned(body=plain_completion([1] * 8)))
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5)), Canned(body=after))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--min-acceptance-length", "1")
    assert r.code == 1 and r.err.strip().splitlines()[-1] == \
        f"Error: --endpoint {server.url}/metrics: impossible counts around the run: {said}"
    server.answer("/metrics", Canned(body=prometheus(10, 30, 12, [6, 4, 2], done=5)),
                  Canned(body=prometheus(16, 48, 21, [10, 7, 4], done=7).replace(b"} 16.0", b"} 16.5")))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path))
    assert r.code == 1 and "its counters could not be read (/metrics: vllm:spec_decode_num_drafts_total is 16.5, " \
        "not a whole count)" in r.err.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["20", 0, -1, True, 20.0])
def test_malformed_max_model_len_on_the_card_is_an_error(server, tmp_path, cli, value):
    """The card's max_model_len bounds --context-lengths: a value that is no positive integer is exit 1 naming the
    field and URL, never the length check skipped (16 + 8 > 20 passed)."""
    server.answer("/v1/models", Canned(body=models("m", max_model_len=value)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "16",
            "--max-new-tokens", "8")
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: --endpoint {server.url}/v1/models: the card of 'm' gives max_model_len {value!r}, not a positive "
        "number of tokens: the served context is unknown")
    assert not [s for s in server.seen if s.path == "/v1/completions"]


def test_context_phase_at_another_k_or_of_no_verify_step_is_not_mixed_in(server, tmp_path, cli):
    """A --context-lengths phase answered at another number of draft tokens per step than the run's prompts (another
    configuration), or with 0 verify steps, is an error naming the phase, never a point of the curve."""
    ids = tmp_path / "long.txt"
    ids.write_text(" ".join(str(3 + i) for i in range(40)) + "\n")
    args = ("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--context-lengths", "16",
            "--long-context-file", ids, "--max-new-tokens", "8")
    server.answer("/v1/completions", Canned(body=_by_length({16: [0, 0, 0, 0, 0, 2]}, [0, 0, 3])))
    r = cli(*args)
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: the --context-lengths phase of 16 tokens: --endpoint {server.url}: this phase was served at 5 draft "
        "tokens per verify step, the run's prompts at 2: another configuration, not mixed into the curve")
    server.answer("/v1/completions", Canned(body=_by_length({16: [0, 0, 0]}, [0, 0, 3])))
    r = cli(*args)
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: the --context-lengths phase of 16 tokens: --endpoint {server.url}: cannot measure: the 2 answer(s) "
        "carried per-request statistics of 0 verify steps: nothing was speculated, no tau to report")


def test_some_answers_with_statistics_some_without_says_how_many(server, tmp_path, cli):
    """Per-request statistics in one answer of two, and no counters to fall back on: the error counts both."""
    server.answer("/v1/completions", Canned(body=lambda body: plain_completion([7] * 8) if body["prompt"][0] == 10
                                            else vllm_completion([0, 0, 2], tokens=[7] * 8)))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--max-new-tokens", "8")
    assert r.code == 1 and r.err.strip().splitlines()[-1].startswith(
        f"Error: --endpoint {server.url}: cannot measure: 1 of 2 answers carried per-request statistics and 1 did not "
        "(the first: the answer to prompt 1) and its counters could not be read (/metrics: HTTP 404")
    server.answer("/metrics", Canned(body=b"# no vllm here\n"))
    r = cli("validate", "--endpoint", server.url, "--prompts", _ids_prompts(tmp_path), "--max-new-tokens", "8")
    assert r.code == 1 and r.err.strip().splitlines()[-1] == (
        f"Error: --endpoint {server.url}: cannot measure: 1 of 2 answers carried per-request statistics and 1 did not "
        "(the first: the answer to prompt 1), and its /metrics has no spec-decode counter; start vLLM with "
        "--per-request-spec-decode-metrics summary (each answer then carries its own counts), or measure while "
        "nothing else is sent to the server")
