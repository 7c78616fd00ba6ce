"""The command line of ``rattn``: its parser and subcommands' arguments, and the readers of
the values ``--seeds`` and ``--set`` take."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from proofs_checks.cli.rank import add_rank_arguments

BENCHMARKS = ("stiefel", "geometries", "port", "model", "train", "audit")

#: ``--seeds`` must lie in 0 ≤ s < SEED_LIMIT = 2**32, the seed range of NumPy's legacy
#: ``np.random.seed`` / ``RandomState``; larger values overflow where a run uses them.
SEED_LIMIT = 2**32


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit status 2 through ``main``'s return value."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rattn", description="Riemannian attention: checked propositions.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    cert = sub.add_parser("certify", help="run the registered propositions and write certificates")
    add_certify_arguments(cert)

    geos = sub.add_parser("geometries", help="list the ten geometries with measured orders")
    geos.add_argument("--m", type=int, default=8, help="rows (default 8)")
    geos.add_argument("--n", type=int, default=6, help="columns (default 6)")
    geos.add_argument("--r", type=int, default=2, help="rank (default 2)")
    geos.add_argument("--json", action="store_true", help="print one JSON document")

    rank = sub.add_parser("rank", help="estimate the intrinsic rank of sequences before training")
    add_rank_arguments(rank)

    comp = sub.add_parser(
        "compare",
        help="run seeded problems through the reference and the torch port, table of deviations",
    )
    comp.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    comp.add_argument(
        "--dtype",
        default="float64,float32,bfloat16",
        help="comma-separated dtypes of the port (default float64,float32,bfloat16)",
    )
    comp.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per case (default: 20; with --full each case's own, 100 or 50)",
    )
    comp.add_argument(
        "--full",
        action="store_true",
        help="every case of the table (195, a few minutes) instead of each geometry × rule "
        "once at 20 steps (under a minute)",
    )
    comp.add_argument("--seed", type=int, default=0, help="seed of the problems (default 0)")
    comp.add_argument(
        "--geometry",
        action="append",
        default=None,
        help="only the problems of this geometry (repeatable; default: all registered)",
    )
    comp.add_argument("--json", action="store_true", help="print one JSON document")

    ver = sub.add_parser(
        "verify", help="re-run a certificate on the installed code: does every field match?"
    )
    ver.add_argument("certificate", help="a certificate.json written by rattn certify")
    ver.add_argument("--json", action="store_true", help="print one JSON document")

    aud = sub.add_parser(
        "audit",
        help="replay a recorded training run (torch_port.audit.record) through the reference",
    )
    aud.add_argument("trace", help="the .npz file written by torch_port.audit.record")
    aud.add_argument("--json", action="store_true", help="print one JSON document")
    aud.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="draw deviation/bound (PNG; a folder: audit.png in it)",
    )
    aud.add_argument(
        "--rule", default=None, help="replay against this rule (rattn conform's names)"
    )
    add_set_argument(aud, "a hyperparameter of --rule; the rest are the rule's defaults")

    conf = sub.add_parser(
        "conform", help="run the property suite on a Riemannian optimizer (MODULE:FACTORY)"
    )
    conf.add_argument("target", help="MODULE:FACTORY, called as factory(params)")
    conf.add_argument(
        "--geometry",
        default="stiefel",
        help="stiefel (default) or one of the ten design points (rattn geometries)",
    )
    conf.add_argument("--rule", default=None, help="the reference rule it claims to follow")
    add_set_argument(conf, "a hyperparameter of the rule; lr also sets the optimizer's")
    conf.add_argument(
        "--claims",
        default=None,
        help="comma-separated claims, e.g. manifold,tangent,order=2,degree=0 (default: the rule's)",
    )
    conf.add_argument("--dtype", default="float64", help="float64 (default) or float32")
    conf.add_argument("--seed", type=int, default=0, help="seed of the problem (default 0)")
    conf.add_argument("--json", action="store_true", help="print one JSON document")
    conf.add_argument("--out", default=None, help="write conformance.json/.md/.tex here")

    exp = sub.add_parser("experiment", help="run an experiment (needs torch and matplotlib)")
    add_experiment_arguments(exp)

    bench = sub.add_parser("bench", help="run a benchmark (not a test) and print its table")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument(
        "--d", type=int, default=512, help="stiefel, port (a): frame rows (default 512)"
    )
    bench.add_argument(
        "--r",
        type=int,
        default=64,
        help="stiefel, port (a): columns; geometries: rank (default 64)",
    )
    bench.add_argument("--m", type=int, default=512, help="geometries: rows (default 512)")
    bench.add_argument("--n", type=int, default=512, help="geometries: columns (default 512)")
    bench.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=(
            "timed rounds (default 30 for stiefel, 10 for geometries, 5 for port, model, "
            "train, audit)"
        ),
    )
    bench.add_argument("--device", default="cpu", help="port, train: cpu (default) or cuda")
    bench.add_argument(
        "--size", default="small", help="train: small (default) or gpt2-small (124 M)"
    )
    bench.add_argument(
        "--dtype", default=None, help="port: float32,float64 (default), bfloat16 too"
    )
    bench.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def add_certify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", metavar="ID", help="proposition ids (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer property examples")
    parser.add_argument("--seed", type=int, default=0, help="seed of every check (default 0)")
    parser.add_argument(
        "--out", default="certificate", help="directory for certificate.{json,md,tex}"
    )
    parser.add_argument("--list", action="store_true", help="list the propositions and exit")
    parser.add_argument("--json", action="store_true", help="print the certificate as JSON")


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        help="grokking, patches, lm, movement, ablation, trust, ladder, native-rank, rank-edge",
    )
    parser.add_argument(
        "--preset",
        default="quick",
        choices=("smoke", "quick", "long", "paper"),
        help="smoke (seconds), quick (CPU minutes, default), long (grokking: the paper's "
        "setting for 30 CPU minutes; patches: 1,000 to 4,000 real MNIST images; movement: the "
        "cost of freezing over 64 seeds) or paper (the paper's scale)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default: the preset's)"
    )
    parser.add_argument("--out", default="results", help="output directory (default results/)")
    parser.add_argument("--data-dir", default=None, help="patches: a local CIFAR-10 directory")
    parser.add_argument("--corpus", default=None, help="lm: a text file (default: stdlib sources)")
    add_set_argument(
        parser,
        "replace an entry of the preset's configuration (e.g. --set lr=1e-3 --set init=torch)",
    )
    parser.add_argument(
        "--no-resume", action="store_true", help="start afresh, ignoring checkpoints"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as one JSON document"
    )


def add_set_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """A repeatable ``--set KEY=VALUE`` (``parse_overrides`` reads it)."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{what} (VALUE as JSON, else a string); repeatable",
    )


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """The seeds of ``--seeds A,B,...`` (None when not given). Refused, naming the values:
    anything but comma-separated integers; a seed outside 0 ≤ s < SEED_LIMIT; a seed given
    twice (it would run once and be counted as two independent seeds)."""
    if text is None:
        return None
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    outside = [s for s in seeds if not 0 <= s < SEED_LIMIT]
    if outside:
        raise ValueError(
            f"--seeds must be integers in 0 ≤ s < 2**32 = {SEED_LIMIT} (NumPy's seed range), got "
            f"{', '.join(map(str, outside))}"
        )
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"--seeds {text!r} repeats {', '.join(map(str, repeated))}: each seed is one run, "
            "give each once"
        )
    return seeds


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` entries as a dict: VALUE read as JSON (numbers, lists, true, null),
    else kept as a string; a malformed or repeated entry is refused, naming it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key = key.strip()
        if key in out:
            raise ValueError(f"--set {key} given twice")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out
