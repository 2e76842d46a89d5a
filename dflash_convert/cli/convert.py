"""`convert`: a checkpoint between the speculators and HF / z-lab formats, then optionally validated and pushed."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._options import with_options
from dflash_convert.cli._output import Output
from dflash_convert.cli._params import (
    CommitDescription, CommitMessage, CreatePr, Json, Private, QuietTransfer, Revision, Source, Token, examples, flag
)
from dflash_convert.convert.conversion import ConvertOptions

EXAMPLES = examples(
    "dflash-convert convert ./draft-speculators -o ./draft-hf",
    "dflash-convert convert org/draft --revision v1 -o ./draft-hf --verifier Qwen/Qwen3-8B --validate",
    "dflash-convert convert ./draft-hf -o ./out --to speculators --dtype bfloat16 --max-shard-size 5GB",
    "dflash-convert convert ./draft -o ./draft-hf --push org/draft-hf --create-pr")


@with_options(ConvertOptions)
def convert(
    src: Source,
    output: Annotated[Path, typer.Option("-o", "--output", help="Destination directory (written atomically).")],
    options: dict,  # ConvertOptions' own flags, generated (cli._options)
    validate: Annotated[bool, flag("--validate", help="Run static + numeric validation on the output before it "
                                   "is committed (always done with --push).")] = False,
    strict: Annotated[bool, flag("--strict", help="Fail (exit 3, nothing written) when the output has any problem "
                                 "`inspect` reports; without it they are warnings.")] = False,
    revision: Revision = None,
    token: Token = None,
    push: Annotated[Optional[str], typer.Option("--push", metavar="REPO", help="Then push the output to this Hub "
                                                "repo (created if missing).")] = None,
    push_revision: Annotated[Optional[str], typer.Option("--push-revision", help="With --push: the branch to push "
                                                         "to (default: main).")] = None,
    private: Private = False,
    commit_message: CommitMessage = None,
    commit_description: CommitDescription = None,
    create_pr: CreatePr = False,
    as_json: Json = False,
    quiet: QuietTransfer = False,
    verbose: Annotated[bool, flag("-v", "--verbose", help="List every config key the conversion added, dropped "
                                  "or rewrote, with why (conversion.json records them either way).")] = False,
) -> None:
    """Convert a DFlash checkpoint between the speculators and HF / z-lab formats."""
    from dflash_convert.publish import convert_and_publish

    out = Output(as_json, quiet)
    # the weights are hashed against their Hub cache names in the conversion's own read of them
    src_path, src_sha = out.local(src, revision=revision, token=token, allow_pickle=options["allow_pickle"],
                                  verify_weights=False)
    verifier = options.get("verifier")
    if verifier:
        options["verifier"], options["verifier_name"] = out.local(verifier, token=token, config_only=True)[0], verifier
    opts = ConvertOptions(**options, source_revision=src_sha, source_id=src if src_sha else None)
    if push:
        out.hub()
    push_options = dict(revision=push_revision, private=private, commit_message=commit_message,
                        commit_description=commit_description, create_pr=create_pr, token=token, on_info=out.info)
    with out.progress("converting", then="checking the inputs: sha256 of each file, NaN/Inf") as update:
        done = convert_and_publish(src_path, output, opts, validate=validate, push=push, push_options=push_options,
                                   on_progress=update, on_warning=out.warn, on_status=out.status, strict=strict)
    record = done.record
    lines = [f"converted {record.source_format} -> {record.destination_format}: {output} "
             f"({len(record.tensors_kept)} tensors kept, {len(record.tensors_dropped)} dropped)"]
    if not quiet:
        lines += [f"  dropped {name}: {reason}" for name, reason in record.tensors_dropped.items()]
        lines += [f"  added {name}: {how}" for name, how in record.tensors_added.items()]
        lines += _config_lines(record.config_changes, verbose)
    if done.push:
        lines.append(done.push.pr_url or done.push.commit_url)
    out.result(done.to_dict(), "\n".join(lines))


def _config_lines(changes, verbose: bool) -> list[str]:
    """One line counting the config keys changed by kind; with -v one line per key and why."""
    if verbose:
        return [f"  config {c.key} {c.change}" + (f": {c.why}" if c.why else "") for c in changes]
    if not changes:
        return []
    kinds: dict[str, int] = {}
    for c in changes:
        kinds[c.change] = kinds.get(c.change, 0) + 1
    return ["  config: " + ", ".join(f"{n} key(s) {kind}" for kind, n in kinds.items())
            + " (-v lists them with why; conversion.json records them)"]
