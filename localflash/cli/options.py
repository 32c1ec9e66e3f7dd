"""The command-line options that several commands share, each defined once.

A command asks for a group of options by a parameter typed with the group and
defaulted to :func:`use` (per-command defaults and left-out flags go there)::

    @app.command()
    @shared_options
    def serve(load: LoadFlags = use(), sampling: SamplingFlags = use(temp=0.7), port: int = 8000):
        llm = open_llm(load.config())

:func:`shared_options` puts the group's flags into the command's help where the
parameter stands and hands the command the filled group. Single shared flags
(``--max-tokens``, ``--raw``, ``--system``) are :class:`Flag` objects:
``max_tokens: int = MAX_TOKENS.option(256)``.

No heavy imports here: ``--help`` stays instant.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import asdict, dataclass, fields, make_dataclass
from typing import Any, Callable, Optional

import typer

from localflash.config import LOAD_OPTIONS, config_from_options
from localflash.errors import LocalflashError


@dataclass(frozen=True)
class Flag:
    """One option: its type, default, names, help and an optional check of the value."""

    type: Any
    default: Any
    decls: tuple[str, ...]
    help: str | None = None
    check: Callable[[Any], None] | None = None

    def option(self, default: Any = inspect.Parameter.empty, also: tuple[str, ...] = ()):
        """A typer option for a command parameter; ``also``: more names for it in that command."""
        default = self.default if default is inspect.Parameter.empty else default
        callback = None
        if self.check is not None:
            check = self.check

            def callback(value):
                if value is not None:
                    check(value)
                return value

        return typer.Option(default, *self.decls, *also, help=self.help, callback=callback)


def _at_least_one(name: str):
    def check(value):
        if value < 1:
            raise LocalflashError(f"{name} must be at least 1, got {value}")

    return check


MAX_TOKENS = Flag(int, 256, ("--max-tokens", "-n"), "Longest reply in tokens (bench: per prompt).", _at_least_one("--max-tokens"))
RAW = Flag(bool, False, ("--raw",), "Send the prompt as is, without the chat template.")
PARALLEL = Flag(int, 1, ("--parallel", "-np"), "Parallel slots: N requests decoded together, sharing one KV pool of -c/--ctx "
                "(--kv-pool split: 1/N each; serve: default 4; bench: aggregate tok/s per mode; plan: prices N sequences).", _at_least_one("--parallel"))
SYSTEM = Flag(Optional[str], None, ("--system", "-s"), "System prompt (chat template only).")
# the model flags: the CLI side of config.LOAD_OPTIONS (the options that have CLI names)
LOAD_FLAGS = {name: Flag(o.type, o.default, o.flags, o.help) for name, o in LOAD_OPTIONS.items() if o.flags}
PAIR, MODEL, DRAFTER, DRAFT_MAX = (LOAD_FLAGS[n] for n in ("pair", "model", "drafter", "draft_max"))

SAMPLING_FLAGS = {
    "temp": Flag(float, 0.0, ("--temp",), "Temperature; 0 is greedy."),
    "top_k": Flag(int, 40, ("--top-k",), "Keep the k most likely tokens (0: all)."),
    "top_p": Flag(float, 1.0, ("--top-p",), "Keep the most likely tokens up to this probability mass (1: all)."),
    "min_p": Flag(float, 0.0, ("--min-p",), "Drop tokens below this fraction of the top token's probability."),
    "seed": Flag(Optional[int], None, ("--seed",), "Random seed for sampling (same seed, same output)."),
}


def _load_config(self):
    """The RunConfig these flags ask for (a pair merged with the flags given)."""
    return config_from_options(**asdict(self))


# Which model(s) to load and how: the flags every model-loading command takes (one field per LOAD_FLAGS entry).
LoadFlags = make_dataclass("LoadFlags", [(name, f.type, f.default) for name, f in LOAD_FLAGS.items()], namespace={"config": _load_config})
LoadFlags.__module__ = __name__
LoadFlags.__doc__ = "Which model(s) to load and how: the flags every model-loading command takes."


@dataclass
class SamplingFlags:
    temp: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def params(self):
        """The checked SamplingParams (a bad value is a one-line error)."""
        from localflash.api import SamplingParams

        return SamplingParams(temperature=self.temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed)


GROUPS: dict[type, dict[str, Flag]] = {LoadFlags: LOAD_FLAGS, SamplingFlags: SAMPLING_FLAGS}


@dataclass(frozen=True)
class Use:
    """A command's take on a group: other defaults, flags left out."""

    defaults: dict
    skip: tuple[str, ...]


def use(*, skip: tuple[str, ...] = (), **defaults) -> Any:
    """The default of a group parameter: ``use(temp=0.8)``, ``use(skip=("spec",))``."""
    return Use(defaults, tuple(skip))


def shared_options(fn):
    """Expand each group parameter of ``fn`` into its flags; call ``fn`` with the filled groups."""
    hints = typing.get_type_hints(fn)
    params, groups = [], {}
    for p in inspect.signature(fn).parameters.values():
        group = hints.get(p.name)
        if group not in GROUPS:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation)))
            continue
        how = p.default if isinstance(p.default, Use) else Use({}, ())
        flags = GROUPS[group]
        unknown = set(how.defaults) - set(flags) | set(how.skip) - set(flags)
        assert not unknown, f"{fn.__name__}: no such {group.__name__} flag(s): {sorted(unknown)}"
        names = [f.name for f in fields(group) if f.name not in how.skip]
        groups[p.name] = (group, names)
        for name in names:
            flag = flags[name]
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=flag.type,
                                            default=flag.option(how.defaults.get(name, inspect.Parameter.empty))))

    @functools.wraps(fn)
    def command(**kw):
        for pname, (group, names) in groups.items():
            kw[pname] = group(**{n: kw.pop(n) for n in names})
        return fn(**kw)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
