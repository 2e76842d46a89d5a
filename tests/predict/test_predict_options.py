"""predict's options are one typed object (PredictOptions): the CLI's flags are generated from it, a library
caller builds it with the same rules and words, and `run` takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_convert.errors import UsageError
from dflash_convert.predict.options import PredictOptions, run

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
PAIR_OPTIONS = dict(target=PAIR / "target", draft=PAIR / "draft")


def test_the_library_and_the_command_line_give_one_report(cli):
    """The flags' texts and a library caller's values are read alike: `64k`, K=TAU lists, lists given twice."""
    r = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H100", "--gpu", "rtx 4090",
            "--tau", "3=2.5", "--tau", "7=3.5", "--concurrency", "1,4", "--input-len", "64k", "--engine", "sglang",
            "--json")
    assert r.code == 0, r.err
    options = PredictOptions(**PAIR_OPTIONS, gpu=["H100", "rtx 4090"], tau={3: 2.5, 7: 3.5}, concurrency=[1, 4],
                             input_len=65536, engine="sglang")
    assert run(options).model_dump(mode="json") == json.loads(r.out)
    assert PredictOptions(**PAIR_OPTIONS, gpu=["H100,rtx 4090"], tau=["3=2.5", "7=3.5"], concurrency=["1,4"],
                          input_len="64k", engine="sglang") == options


REFUSED = [
    (dict(gpu=["H100,h100"], tau={7: 3}), "--gpu H100,h100: H100 and h100 are both H100-SXM"),
    (dict(gpu=["H100"], tau={7: 9}), "--tau 7=9: tau of K=7 must be in [1, 8] (tokens per step), got 9"),
    (dict(gpu=["H100"], tau=["3=2.5", "3=2.6"]), "--tau 3=2.5,3=2.6: K 3 is given twice"),
    (dict(gpu=["H100"]), "no tau: give --tau K=TAU[,K=TAU...] or --from-report REPORT"),
    (dict(tau={7: 3}), "give --gpu NAME[,NAME...] or --gpu-spec"),
    (dict(gpu=["H100"], tau={7: 3}, tp=0), "--tp must be an integer in [1, 1024], got 0"),
    (dict(gpu=["H100"], tau={7: 3}, input_len="2 thousand"),
     "--input-len 2 thousand: expected a token count (8192, 8k; k = 1024)"),
    (dict(gpu=["H100"], tau={7: 3}, output_len=10_000_001),
     "--output-len must be an integer in [1, 10000000] (tokens), got 10000001"),
    # a request's first token comes from its prefill: no output is no request
    (dict(gpu=["H100"], tau={7: 3}, output_len=0), "--output-len must be an integer in [1, 10000000] (tokens), got 0"),
    (dict(gpu=["H100"], tau={7: 3}, output_len="0"), "--output-len must be an integer in [1, 10000000] (tokens), got 0"),
    (dict(gpu=["H100"], tau={7: 3}, engine="trt"), "--engine 'trt': choose vllm or sglang"),
    (dict(gpu=["H100"], gpu_spec=["name=H100-SXM,bw=1,bf16=1"], tau={7: 3}),
     "--gpu-spec name=H100-SXM,bw=1,bf16=1: name H100-SXM is --gpu's H100 too (name it otherwise)"),
    (dict(gpu=["H100"], tau={7: 3}, colour="red"), "PredictOptions has no option 'colour'"),
]


@pytest.mark.parametrize("bad, says", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_refused_value_is_the_flag_s_one_line_for_a_library_caller_too(bad, says):
    with pytest.raises(UsageError) as refused:
        PredictOptions(**PAIR_OPTIONS, **bad)
    assert str(refused.value) == says
