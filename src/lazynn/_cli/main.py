"""The command line: ``lazynn summary TARGET --input 1x3x224x224`` (or ``python -m lazynn``;
the word ``summary`` may be left out: ``lazynn TARGET --input ...``).

``TARGET`` names a model factory: ``FILE.py:NAME`` (a function or class in a Python file) or
``package.module:NAME`` (in an importable module), optionally with literal arguments in
Python call syntax, ``FILE.py:NAME(2, width=64)``. The factory is called on the meta device,
so even a 70B-parameter model costs no memory; the summary is computed on meta too. Errors
print one line (what, where, the fix, naming this command's flags; ``fixes.py``) and exit with
status 2, no traceback (``--traceback`` prints it before the line). What the user's code
prints goes to stderr: stdout holds the summary alone (``--format svg`` and ``png``: the
picture ``dot`` draws of it, ``images.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import itertools
import re
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import torch

from .._errors import LazynnError, first_line
from .._summary.memory import optimizer_class, supported_optimizers
from .._summary.render import FORMATS
from .._summary.summary import summary
from .._summary.table import terminal_width
from .fixes import cli_line, one_line, user_line
from .images import IMAGES, check_image, draw
from .input_flags import check_bytes, model_dtype, parse_input
from .targets import CommandError, construct, load_factory, parse_target

__all__ = ["console", "main"]

_USAGE_EXAMPLE = "lazynn summary examples/models.py:resnet50 --input 1x3x224x224"
#: --format's choices: the summary's renderings, and the images dot draws of its graph
_FORMATS = (*FORMATS, *IMAGES)
#: the commands; the first is the one a command line without one runs
_COMMANDS = ("summary",)
#: lazynn's own options (before a command), which a command line without one keeps
_OWN_OPTIONS = ("-h", "--help", "--version")


def _version() -> str:
    """What --version prints: lazynn's version and torch's."""
    try:  # (as lazynn.__version__: the installed distribution's)
        version = metadata.version("lazynn")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"lazynn {version} (torch {torch.__version__})"


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments, with their help texts."""
    parser = argparse.ArgumentParser(
        prog=_prog(),
        usage="%(prog)s [-h] [--version] [summary] TARGET --input SHAPE [options]",
        description="Shape-inferring (lazy) layers for PyTorch. The one command, summary, "
        "may be left out: '%(prog)s nets.py:Net --input 2x3x32x32' is '%(prog)s summary "
        "nets.py:Net --input 2x3x32x32' (see '%(prog)s summary --help' for its options).",
        epilog=f"example: {_USAGE_EXAMPLE}",
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd = _summary_command(commands, parser.prog)
    _view_options(cmd)
    _run_options(cmd)
    return parser


def _summary_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], prog: str
) -> argparse.ArgumentParser:
    """The summary command: what it does, its examples, TARGET, --input, --dtype and
    --traceback (its view and its run: :func:`_view_options`, :func:`_run_options`)."""
    cmd = commands.add_parser(
        "summary",
        prog=f"{prog} summary",
        help="print a model's layers, shapes and parameter counts, computed on meta",
        description="Print the summary table of a model built from example input shapes.\n"
        "Nothing is allocated: the model is constructed and run on the meta device.",
        epilog="examples:\n"
        "  lazynn summary examples/models.py:resnet50 --input 1x3x224x224\n"
        "  lazynn examples/models.py:resnet50 --input 1x3x224x224   (the same: summary is "
        "the default)\n"
        "  lazynn summary examples/models.py:resnet50 --input 1x3x224x224 --format svg "
        "> resnet50.svg\n"
        "  lazynn summary 'examples/models.py:lazy_llama(2, 64, 4, 128, 1000)' "
        "--input 1x16:long\n"
        "  lazynn summary examples.models:gpt2_medium --input 1x1024:long\n"
        "  lazynn summary lm.py:LanguageModel --input 4x16:long --input '(2x4x32, 2x4x32)'\n"
        "      (a forward(tokens, state) whose state is a tuple (h0, c0): a parenthesized\n"
        "      group of shapes is a tuple argument)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "target",
        metavar="TARGET",
        help="the model's factory: FILE.py:NAME (a function or class the Python file defines, "
        "or an attribute of one, Net.from_config; not a name it imports) or MODULE:NAME (in "
        "an importable module such as pkg.models), called with no arguments, "
        "or with literal arguments in Python call syntax: 'FILE.py:NAME(2, width=64)' "
        "(quote it for the shell)",
    )
    cmd.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SHAPE[:DTYPE]",
        help="an example input shape such as 1x3x224x224, or 1x1024:long for token ids "
        "(without a dtype: the model's, see --dtype); repeat for several inputs, in the "
        "order of forward's arguments; a tuple argument is a parenthesized group of them, "
        "'(2x4x32, 2x4x32)' (quote it for the shell; groups nest)",
    )
    cmd.add_argument(
        "--dtype",
        default=None,
        help="the model's dtype: float32, float64, float16 or bfloat16 (what torch takes as "
        "the default dtype, set while the model is constructed and summarized; default: "
        "float32)",
    )
    cmd.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, print the full traceback (the original exception, then what "
        "lazynn made of it) before the one-line message",
    )
    return cmd


def _view_options(cmd: argparse.ArgumentParser) -> None:
    """What the summary shows: --depth, --expand, --format, --width."""
    view = cmd.add_argument_group("the view")
    view.add_argument(
        "--depth",
        type=_count(0),
        default=None,
        metavar="N",
        help="show modules down to nesting level N (0: the model alone; default: the "
        "deepest level whose table fits a screen)",
    )
    view.add_argument(
        "--expand",
        action="store_true",
        help="show every repeated block (default: one row for a run of identical "
        "consecutive blocks)",
    )
    view.add_argument(
        "--format",
        choices=_FORMATS,
        default="table",
        help="table (text, the default), markdown, json (for scripts: every module, "
        "each block and every depth, with every figure; --depth and --width are for the "
        "tables), dot (the modules as a Graphviz graph, the shapes on its edges; --depth "
        "and --expand choose its boxes as the table's rows), or svg or png (that graph "
        "drawn by Graphviz's dot program, which must be installed: apt install graphviz, "
        "brew install graphviz; png to a file: > model.png)",
    )
    view.add_argument(
        "--width",
        type=_count(0),
        default=None,
        metavar="N",
        help="the text table's widest line, in characters (shapes are shortened first, then "
        "names, each column keeping 12, and a note says what was cut; default: the "
        "terminal's width, at least 80, or 100 when not printing to a terminal; 0: no limit)",
    )


def _run_options(cmd: argparse.ArgumentParser) -> None:
    """How the example runs: --eval, --training, --optimizer."""
    run = cmd.add_argument_group("the run")
    run.add_argument(
        "--eval",
        action="store_true",
        help="run the example in eval mode (default: train mode, as a first training step)",
    )
    run.add_argument(
        "--training",
        action="store_true",
        help="add an estimate of one training step's memory: parameters, gradients, "
        "optimizer states, activations",
    )
    run.add_argument(
        "--optimizer",
        default=None,
        metavar="NAME",
        help="the optimizer of the --training estimate, a torch.optim name in any case: "
        + ", ".join(supported_optimizers())
        + " (default: adamw; not lbfgs, which needs a closure, nor sparseadam, which needs "
        "sparse gradients); implies --training",
    )


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, received {text!r}")
        return value

    return parse


# --- the command --------------------------------------------------------------------------


def _prog() -> str:
    """The command's name, as the user typed it."""
    return "lazynn" if Path(sys.argv[0]).stem == "lazynn" else "python -m lazynn"


def _with_command(argv: list[str]) -> list[str]:
    """``argv`` with its command: ``summary`` put first when left out (``lazynn nets.py:Net
    --input 2x3`` is ``lazynn summary nets.py:Net --input 2x3``), unless the first word is
    lazynn's own option (``--help``, ``--version``, or a prefix argparse takes for one).
    A first word that looks like a mistyped command (a near miss of one, or a word followed
    by a target) is refused with the command to type."""
    if not argv:
        return [_COMMANDS[0]]  # (argparse then names what the command needs)
    first = argv[0]
    prefix = first.startswith("--") and len(first) > 2  # (argparse takes --vers for --version)
    if first in (*_COMMANDS, *_OWN_OPTIONS) or (
        prefix and any(own.startswith(first) for own in _OWN_OPTIONS)
    ):
        return argv
    if not first.startswith("-") and ":" not in first and re.fullmatch(r"[A-Za-z_-]+", first):
        near = difflib.get_close_matches(first, _COMMANDS, n=1)
        target = next(
            (
                word
                for before, word in itertools.pairwise(argv)
                if ":" in word and not word.startswith("-") and not before.startswith("-")
            ),
            None,
        )
        if near or target is not None:
            command = f"{_prog()} {shlex.join([near[0] if near else _COMMANDS[0], *argv[1:]])}"
            followed = f", followed by the target {target!r}" if target is not None else ""
            raise CommandError(
                f"{first!r} is not a command: expected {' or '.join(_COMMANDS)} (which may be "
                f"left out) or a target (FILE.py:NAME, MODULE:NAME) first, received "
                f"{first!r}{followed}.",
                f"run {command}",
            )
    return [_COMMANDS[0], *argv]


#: torchinfo's and habit's flags -> lazynn's
_HABITS = {"--input-size": "--input", "--input_size": "--input", "--input-data": "--input"}


def _check_habits(words: list[str]) -> None:
    """Refuse another tool's flag for lazynn's (torchinfo's ``--input-size 2 3 16 16``),
    before argparse would name only the ``--input`` it lacks."""
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag in _HABITS:
            given = value or " ".join(
                itertools.takewhile(lambda w: not w.startswith("-"), words[i + 1 :])
            )
            sizes = "x".join(re.findall(r"\d+", given)) or "2x3x16x16"
            raise CommandError(
                f"{flag}: expected lazynn's {_HABITS[flag]}, received {flag} (another tool's "
                "name for it).",
                f"write {_HABITS[flag]} {sizes} (one --input per argument of the forward)",
            )


def _check_view(args: argparse.Namespace) -> None:
    """Refuse view flags the chosen format has no use for (rather than ignore them), and an
    image format that cannot be drawn here."""
    if args.format == "json" and args.depth is not None:
        raise CommandError(
            "--depth with --format json: the JSON lists every module, at every depth (each "
            "row's path says how deep it is), with every figure.",
            "drop --depth, or use --format table or markdown",
        )
    if args.format != "table" and args.width is not None:
        raise CommandError(
            f"--width with --format {args.format}: --width cuts the text table's lines, and "
            f"{args.format} is not cut.",
            "drop --width, or use --format table",
        )
    check_image(args.format)


def _check_optimizer(name: str | None) -> None:
    """Refuse an --optimizer the estimate cannot use, before anything runs."""
    if name is not None:
        try:
            optimizer_class(name)
        except LazynnError as error:
            raise cli_line(error, ()) from error


def _summary(args: argparse.Namespace) -> str | bytes:
    """The ``summary`` command: what it prints (an image's bytes for ``png``). The user's
    code (their file, factory and forward) prints to stderr, so that stdout holds the summary
    alone (valid JSON)."""
    inputs = [parse_input(text) for text in args.input]
    target = parse_target(args.target)
    dtype = model_dtype(args.dtype)
    _check_view(args)
    _check_optimizer(args.optimizer)
    check_bytes([i.value for i in inputs], dtype or torch.get_default_dtype())
    leaves = [leaf for i in inputs for leaf in i.leaves]
    previous = torch.get_default_dtype()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            factory = load_factory(target)
            if dtype is not None:
                torch.set_default_dtype(dtype)
            result = summary(
                construct(target, factory),
                *(i.value for i in inputs),
                mode="eval" if args.eval else "train",
                training=args.training or args.optimizer is not None,  # --optimizer implies it
                optimizer=args.optimizer or "adamw",
            )
    except LazynnError as error:
        raise cli_line(error, leaves) from error
    except CommandError:
        raise
    except Exception as error:  # e.g. a shape too large for torch to describe
        raise CommandError(f"{type(error).__name__}: {first_line(error)}") from error
    finally:
        torch.set_default_dtype(previous)
    text = result.render(
        format="dot" if args.format in IMAGES else args.format,
        depth=args.depth,
        expand=args.expand,
        width=terminal_width() if args.width is None else args.width or None,
    )
    if args.format == "svg":
        return draw(text, "svg").decode().rstrip("\n")
    if args.format in IMAGES:
        return draw(text, args.format)
    return text


def _print(output: str | bytes) -> None:
    """Write the summary to stdout: text with a line's end, an image's bytes as they are."""
    if isinstance(output, str):
        print(output)
        return
    sys.stdout.flush()
    sys.stdout.buffer.write(output)
    sys.stdout.buffer.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 on an error)."""
    try:
        words = _with_command(list(sys.argv[1:] if argv is None else argv))
        _check_habits(words)
    except CommandError as error:
        print(f"lazynn: error: {one_line(error)}", file=sys.stderr)
        return 2
    args = _parser().parse_args(words)
    try:
        _print(_summary(args))
    except (CommandError, LazynnError) as error:
        if args.traceback:  # the original exception and what lazynn made of it
            traceback.print_exception(error)
        print(f"lazynn: error: {one_line(error, hint=not args.traceback)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        sys.stderr.close()
    except KeyboardInterrupt:
        print("lazynn: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exit_:  # the user's file or model called sys.exit()
        if args.traceback:
            traceback.print_exception(exit_)
        where = user_line(exit_)
        at = f", at {where}" if where else ""
        print(f"lazynn: error: {args.target} exited ({exit_.code}{at})", file=sys.stderr)
        return 2
    return 0


def console() -> NoReturn:
    """The ``lazynn`` console script (``[project.scripts]``)."""
    sys.exit(main())
