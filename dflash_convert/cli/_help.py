"""How a command's -h reads: click's plain layout, a required argument written plain (`SRC`), and the options
grouped under their panels' headings (an options model's HELP_PANELS) in one order for every command; and
every command's flags given twice held to one rule (_options.refuse_repeated)."""

import re

from typer.core import TyperCommand

from dflash_convert.validate.options import ValidateOptions

# validate's panels in the order its options model declares them (the one list of them), then the command-line
# only ones
PANEL_ORDER = ("Arguments", *ValidateOptions.HELP_PANELS, "Reports", "Options")


class Command(TyperCommand):
    """Usage lines as click and man pages write them: a required argument plain (`SRC`), not typer's `{SRC}`."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        """A single-valued flag given twice with different values is refused before click keeps the last."""
        from dflash_convert.cli._options import refuse_repeated

        if not ctx.resilient_parsing:
            refuse_repeated(self, ctx, args)
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"\{([^{}]+)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        """Arguments, then the options under their panel's heading (an options model's HELP_PANELS) in
        PANEL_ORDER, the rest under Options: click's plain layout, one section per group. -h leads the first
        group of options, where a reader of a long help looks, never a heading of its own at the end."""
        sections: dict[str, list] = {}
        help_record = None
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.name == "help":
                help_record = record
                continue
            heading = "Arguments" if param.param_type_name == "argument" else \
                getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(heading, []).append(record)
        order = {name: i for i, name in enumerate(PANEL_ORDER)}
        headings = sorted(sections, key=lambda h: order.get(h, len(order)))
        if help_record is not None:
            first = next((h for h in headings if h != "Arguments"), "Options")
            sections[first] = [help_record, *sections.get(first, [])]
            headings = sorted(sections, key=lambda h: order.get(h, len(order)))
        for heading in headings:
            with formatter.section(heading):
                formatter.write_dl(sections[heading])
