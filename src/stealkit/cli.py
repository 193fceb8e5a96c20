"""The ``stealkit`` command line: one entry point, commands discovered from :mod:`stealkit.commands`."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

import click

from stealkit import __version__
from stealkit.errors import StealkitError

log = logging.getLogger("stealkit")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (for scripts reading the logs)."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        return json.dumps({"time": round(record.created, 3), "level": record.levelname.lower(),
                           "logger": record.name, "message": record.getMessage()})


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stealkit")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors; no progress bars.")
@click.option("--log-json", is_flag=True, help="Machine-readable logs: one JSON object per line on stderr.")
@click.option("--threads", type=int, default=None, envvar="STEALKIT_THREADS", show_envvar=True,
              help="Intra-op CPU threads per process (default 1: best for the zoo's small models, and robust when "
                   "cores are shared; 0 = one per core).")
@click.option("--track", type=click.Choice(["tensorboard", "mlflow"]), default=None, envvar="STEALKIT_TRACK",
              show_envvar=True, help="Also log every run this command writes to TensorBoard (RUN/tensorboard) or "
                                     "MLflow (settings, ledger counts, curves); the 'track' extra.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool, log_json: bool, threads: int | None,
        track: str | None) -> None:
    """stealkit: model extraction, transfer attacks and certified robustness for deployed classifiers.

    Every command writes a run directory (config.json, records.jsonl, summary.json, report.html).
    """
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_json else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if verbose < 1:  # third-party request logs (httpx logs every request at INFO) only with -v
        for name in ("httpx", "httpcore", "urllib3", "matplotlib", "PIL"):
            logging.getLogger(name).setLevel(logging.WARNING)
    from stealkit.threads import apply_threads, resolve_threads

    apply_threads(resolve_threads(threads))
    ctx.ensure_object(dict)
    _TRACK[:] = [track] if track else []
    if track:  # commands run in-process by this one (reproduce, run) inherit it
        import os

        os.environ["STEALKIT_TRACK"] = track
    ctx.obj["quiet"] = quiet
    if quiet:
        import os

        os.environ["STEALKIT_QUIET"] = "1"


@cli.group()
def extract() -> None:
    """Steal a victim: query it through an oracle and train a copy. One subcommand per method."""


@cli.group()
def study() -> None:
    """Reproduce a paper's table or figure: one subcommand per study."""


def _discover() -> None:
    import stealkit.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"stealkit.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(cli)


_discover()


def _short_help(text: str, limit: int = 55) -> str:
    """The first paragraph, cut at a word boundary: click's default stops at the first period, so a help that
    starts "DaST (Zhou et al. 2020) ..." would read "DaST (Zhou et al." in the list of commands."""
    first = " ".join(text.strip().split("\n\n")[0].split())
    i = first.find(". ")  # the first sentence end that is not an abbreviation
    while i != -1 and first[max(0, i - 5):i].endswith(("et al", "e.g", "i.e", "Sec", "Alg", "Fig", "vs")):
        i = first.find(". ", i + 1)
    if i != -1:
        first = first[:i + 1]
    return first if len(first) <= limit else first[:limit].rsplit(" ", 1)[0] + "..."


def _set_short_helps(group: click.Group) -> None:
    for cmd in group.commands.values():
        if cmd.short_help is None and cmd.help:
            cmd.short_help = _short_help(cmd.help)
        if isinstance(cmd, click.Group):
            _set_short_helps(cmd)


_set_short_helps(cli)


#: the --track back end of the current invocation (empty: none)
_TRACK: list[str] = []


def _track_runs() -> None:
    """After a command succeeded: log every run directory it wrote to the --track back end."""
    from stealkit.rundir import OPENED, RunDir
    from stealkit.tracking import log_run

    for path in dict.fromkeys(OPENED):
        click.echo(f"tracked {path}: {log_run(RunDir(path), _TRACK[0])}", err=True)
    OPENED.clear()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one clear line on stderr and exit code 2."""
    try:
        from stealkit.rundir import OPENED

        OPENED.clear()
        rv = cli.main(args=argv, prog_name="stealkit", standalone_mode=False)
        if _TRACK:
            _track_runs()
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except StealkitError as exc:
        from stealkit.rundir import discard_unfinished_runs

        discard_unfinished_runs()
        click.echo(f"error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
