"""How a command's -h reads: click's plain layout, a required argument written plain (`SRC`), and the options
grouped under their panels' headings (an options model's HELP_PANELS) in one order for every command."""

import re

from typer.core import TyperCommand

PANEL_ORDER = ("Arguments", "Inputs", "Decoding", "Runtime", "Engine", "Thresholds", "Reports", "Options")


class Command(TyperCommand):
    """Usage lines as click and man pages write them: a required argument plain (`SRC`), not typer's `{SRC}`."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"\{([^{}]+)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        """Arguments, then the options under their panel's heading (an options model's HELP_PANELS) in
        PANEL_ORDER, the rest under Options: click's plain layout, one section per group."""
        sections: dict[str, list] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                heading = "Arguments" if param.param_type_name == "argument" else \
                    getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(heading, []).append(record)
        order = {name: i for i, name in enumerate(PANEL_ORDER)}
        for heading in sorted(sections, key=lambda h: order.get(h, len(order))):
            with formatter.section(heading):
                formatter.write_dl(sections[heading])
