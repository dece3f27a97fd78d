"""The command line every stage, flow and script shares for choosing its params: ``--params`` (the file,
default ``$RUBRICFLOW_PARAMS`` or params.yaml), ``--profile``, repeatable ``--overlay NAME`` (layers of the
file's ``overlays`` applied over the profile, in the order given) and repeatable ``--set KEY=VALUE`` overrides.

    parser = stage_argparser(__doc__)                   # add your own arguments to it
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    params = params_from_args(args)                     # components.params.Params, overrides applied
"""

from __future__ import annotations

import argparse
import os

from components.params import Params
from components.params_load import load_params

PARAMS_PATH = os.environ.get("RUBRICFLOW_PARAMS", "params.yaml")


def stage_argparser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--params``, ``--profile``, ``--overlay`` and ``--set``."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--params", default=PARAMS_PATH, help="params file (default: params.yaml)")
    parser.add_argument("--profile", default=None, help="profile to apply (default: the file's)")
    parser.add_argument("--overlay", dest="overlays", action="append", default=None, metavar="NAME",
                        help="apply an overlay of the params file over the profile, e.g. --overlay smoke (repeatable)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a parameter, e.g. --set data.source=hotpotqa (repeatable)")
    return parser


def params_from_args(args: argparse.Namespace) -> Params:
    """The params that ``args`` (parsed by a :func:`stage_argparser`) name."""
    return load_params(args.params, args.profile, args.overrides, overlays=getattr(args, "overlays", None))
