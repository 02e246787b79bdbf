"""One example line per command, appended to its `--help` (issue 12: help that reads like the best
CLIs). Kept in one table rather than in every command's docstring so the examples read as a set
and a command without one fails tests/test_cli_help.py; a docstring that already ends with its
own `Example:` keeps it.

Also tidy_help: two fixes to Typer's help that every command needs.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Command path -> one runnable line (no square brackets: the help is rich markup).
EXAMPLES: dict[str, str] = {
    "advice": (
        "better-compute advice --pool west --gpus 8 --gang 4 --topology-key fabric.domain"
        " --start-range now..+14d --duration 3d"
    ),
    "admin add": "better-compute admin add alice",
    "admin list": "better-compute admin list --json",
    "admin remove": "better-compute admin remove alice",
    "backup": "better-compute backup /srv/backups/gpu-2026-09-28.db",
    "cancel": "better-compute cancel rsv_0123456789ab",
    "config get": "better-compute config get placement.topN",
    "config set": "better-compute config set pending.retryMs 60000",
    "demo": "better-compute demo",
    "device quarantine": "better-compute device quarantine west-01:3 --reason xid-79",
    "device restore": "better-compute device restore west-01:3",
    "events": "better-compute events --tenant acme --since 120 --follow",
    "extend": "better-compute extend rsv_0123456789ab --by 2h",
    "get": "better-compute get rsv_0123456789ab --json",
    "init": "better-compute --db lab.db init --demo",
    "inventory export": "better-compute inventory export > fleet.json",
    "inventory import": "better-compute inventory import fleet.json",
    "launch": "better-compute launch rsv_0123456789ab --format torchrun --node west-01",
    "list": "better-compute list --label team=vision --from now --to +1d --sort start",
    "migrate": "better-compute migrate --to postgresql://ops@db.internal/gpus",
    "meter create": "better-compute meter create gpu.h100.hours",
    "meter list": "better-compute meter list",
    "node add": "better-compute node add west-08 --pool west --gpus 8 --model h100 --fabric c1.2",
    "node cordon": "better-compute node cordon west-03 --from +1d --until +1d4h --reason bios",
    "node label": "better-compute node label west-03 rack=r2 zone=a",
    "node list": "better-compute node list --pool west",
    "node mark-reachable": "better-compute node mark-reachable west-03",
    "node mark-unreachable": "better-compute node mark-unreachable west-03",
    "node report-bound": "better-compute node report-bound west-03 rsv_0123456789ab",
    "node show": "better-compute node show west-03",
    "node uncordon": "better-compute node uncordon west-03",
    "policy delete": "better-compute policy delete --tenant acme --principal bob",
    "policy list": "better-compute policy list --tenant acme",
    "policy set": "better-compute policy set --tenant acme --principal bob --max-gpus 16",
    "pool create": "better-compute pool create west --label region=us-west",
    "pool list": "better-compute pool list",
    "pool policy clear": "better-compute pool policy clear west",
    "pool policy set": (
        "better-compute pool policy set west --min-duration 1d --max-duration 14d --min-lead 1d"
        " --sizes 8,16,32,64 --commit"
    ),
    "pool policy show": "better-compute pool policy show west --json",
    "pool set": "better-compute pool set west --auto-bind off",
    "pool show": "better-compute pool show west --json",
    "preview": (
        "better-compute preview --tenant acme --gpus 8 --gang 4 --start-range now..+7d"
        " --duration-range 12h..2d --explain"
    ),
    "quota set": "better-compute quota set --tenant acme --gpus 64 --gpu-hours 20000 --period 30d",
    "quota show": "better-compute quota show --tenant acme",
    "release": "better-compute release rsv_0123456789ab",
    "repair": "better-compute repair rsv_0123456789ab",
    "reserve": (
        "better-compute reserve --tenant acme --gpus 8 --gang 4 --for 12h --start +1d"
        " --name pretrain-7 --key pretrain-7"
    ),
    "restore": "better-compute restore /srv/backups/gpu-2026-09-28.db",
    "simulate": "better-compute simulate --workload openb.csv --format openb --compress 100",
    "tenant create": "better-compute tenant create acme",
    "tenant list": "better-compute tenant list",
    # what cron runs; `tick --until` moves a real clock ahead for good, so it is not the example
    "tick": "better-compute tick  # every minute, from cron",
    "timeline": "better-compute timeline --pool west --from now --to +1d --step 60",
    "update": "better-compute update rsv_0123456789ab --start +2d --for 12h --gpus 4",
    "webhook add": (
        "better-compute webhook add --tenant acme --url https://hooks.example.com/gpu"
        " --events reservation.preempting,reservation.expiring"
    ),
    "webhook list": "better-compute webhook list --json",
    "webhook delete": "better-compute webhook delete whk_0123456789ab",
    "webhook test": "better-compute webhook test whk_0123456789ab",
    "webhook deliveries": "better-compute webhook deliveries --failed",
    "webhook redeliver": "better-compute webhook redeliver --failed --webhook whk_0123456789ab",
    "completion": "better-compute completion bash > ~/.better-compute-completion.bash",
    "usage": "better-compute usage --tenant acme --from -30d --to now",
}


def attach(app: Any, prefix: tuple[str, ...] = ()) -> None:
    """Append `Example: …` to the help of every command registered on `app` (and its groups)
    that has an example and does not give one itself."""
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.strip("_").replace("_", "-")
        example = EXAMPLES.get(" ".join((*prefix, name)))
        # cleandoc: a docstring's later lines keep their indent, which the help would show
        doc = info.help if info.help is not None else inspect.cleandoc(info.callback.__doc__ or "")
        if example is not None and "Example:" not in doc:
            info.help = f"{doc.rstrip()}\n\nExample: {example}"
    for group in app.registered_groups:
        attach(group.typer_instance, (*prefix, group.name))


def tidy_help() -> None:
    """Two fixes to Typer 0.29's help, for every command: a switch takes no value, so no `<bool>`
    after it; an argument reads `RSV` in the usage line, as in Click and man pages, not `{rsv}`."""
    from typer import core

    if getattr(core.TyperOption.display_type_rich, "tidied", False):
        return
    show_type = core.TyperOption.display_type_rich

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else show_type(self, ctx)

    def usage_name(self: Any) -> str:
        name = str(self.display_name_raw).upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    display_type_rich.tidied = True  # type: ignore[attr-defined]
    core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    core.TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]
