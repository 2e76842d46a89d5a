"""`predict`: will DFlash pay off on a GPU? Plain vs speculative tokens/s per K and concurrency, from configs."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._options import with_options
from dflash_convert.cli._output import Output
from dflash_convert.cli._params import Json, Quiet, Token, examples
from dflash_convert.predict.options import PredictOptions, run

EXAMPLES = examples(
    "dflash-convert predict --target Qwen/Qwen3-8B --draft z-lab/Qwen3-8B-DFlash-b16 --gpu H100-SXM,H200 "
    "--tau 7=4.1,15=5.6",
    "dflash-convert predict --target ./target --draft ./draft --gpu A800 --from-report report.json "
    "--concurrency 1,8,64 --input-len 2048 --output-len 512 --engine sglang --json")


@with_options(PredictOptions)
def predict(
    options: dict,  # PredictOptions' own flags, generated (cli._options)
    revision: Annotated[Optional[str], typer.Option("--revision", help="The draft's Hub revision: branch, tag or "
                        "commit sha (default: main); the target is read at main, as validate and inspect read "
                        "it.")] = None,
    token: Token = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Predict plain vs speculative tokens/s per GPU, K and concurrency from the configs alone (no GPU, no
    weights), recommend a K per concurrency or no speculation, with the model's error band."""
    out = Output(as_json, quiet)
    asked = PredictOptions(**options)  # every flag checked (exit 2) before anything is read
    target, draft = str(asked.target), str(asked.draft)
    t_path, _ = out.local(target, token=token, config_only=True)  # --revision is the draft's, as validate's
    d_path, _ = out.local(draft, revision=revision, token=token, config_only=True)
    _refuse_a_draft_as_target(target, t_path, draft, d_path)
    # the launch line serves the model directory (a Hub id as given): vLLM and SGLang take no config.json file
    report = run(asked.model_copy(update=dict(target=t_path, draft=d_path, target_name=_served(target, t_path),
                                              draft_name=_served(draft, d_path))))
    out.result(report.model_dump(mode="json"), render=report.render)


def _refuse_a_draft_as_target(target: str, t_path: Path, draft: str, d_path: Path) -> None:
    """A DFlash draft's config given as --target is a usage error (exit 2) saying so, not a missing target field:
    the two given the other way round, or a draft where the target model belongs."""
    from dflash_convert.cli._params import is_draft, refuse_swapped
    from dflash_convert.errors import UsageError

    if not is_draft(t_path):
        return
    if not is_draft(d_path):
        refuse_swapped(f"--target {target} is a DFlash draft and --draft {draft} is not",
                       f"write --target {draft} --draft {target}")
    raise UsageError(f"--target {target} is a DFlash draft's config, not a target model's: give the model the draft "
                     "was trained for (its verifier) as --target")


def _served(given: str, local: Path) -> str:
    """What a launch line names: the directory of a config.json given as a file, else what the user gave."""
    return str(Path(given).parent) if Path(given).is_file() and Path(local).is_file() else given
