"""The ``rattn`` command. Exit status: 0 all passed, 1 something failed, 2 bad usage or input."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from proofs_checks import early_interrupt
from proofs_checks.certificate import certify, check_destination, resolve_ids, summary_table
from proofs_checks.cli.parser import _UsageError, build_parser, parse_overrides, parse_seeds
from proofs_checks.cli.rank import run_rank_command
from proofs_checks.early_interrupt import INTERRUPTED
from proofs_checks.registry import REGISTRY


def run_experiment(args: argparse.Namespace) -> int:
    """``rattn experiment NAME``: bad usage (bad seeds, unknown name, no torch or matplotlib,
    CUDA missing, bad paths) exits 2 before the run; the run's summary is printed."""
    seeds = parse_seeds(args.seeds)  # first: needs neither torch nor the experiment
    overrides = parse_overrides(args.set)
    try:
        from torch_port import experiments
        from torch_port.experiments.common import RunOptions, require_matplotlib, resolve_device
    except ImportError as exc:
        raise ValueError(
            f"rattn experiment needs torch (pip install 'rattn[torch]'): {exc}"
        ) from None
    if args.name not in experiments.EXPERIMENTS:
        experiments.load(args.name)  # raises, listing the known experiments
    resolve_device(args.device)
    require_matplotlib()
    module = experiments.load(args.name)
    options = RunOptions(
        preset=args.preset,
        device=args.device,
        seeds=seeds,
        out=Path(args.out),
        data_dir=None if args.data_dir is None else Path(args.data_dir),
        corpus=None if args.corpus is None else Path(args.corpus),
        progress=not args.json,
        resume=not args.no_resume,
        overrides=overrides,
    )
    document = module.run(options)
    if args.json:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(module.format_summary(document))
        print(f"\nwrote {Path(args.out) / args.name}")
    return 0


def run_certify(args: argparse.Namespace) -> int:
    ids = resolve_ids(args.ids)
    if args.seed < 0:
        raise ValueError(f"--seed must be ≥ 0, got {args.seed}")
    if args.list:
        rows = [
            {"id": i, "title": REGISTRY[i].title, "kinds": list(REGISTRY[i].kinds)} for i in ids
        ]
        if args.json:
            print(json.dumps(rows, indent=2, ensure_ascii=False))
        else:
            for row in rows:
                print(f"{row['id']:<6} {row['title']}  [{', '.join(row['kinds'])}]")
        return 0
    check_destination(args.out)  # refuse an unusable destination before the checks run
    cert = certify(ids, quick=args.quick, seed=args.seed, progress=not args.json)
    try:
        paths = cert.write(args.out)
    except OSError as exc:  # e.g. the disk filled up; the previous certificates are intact
        raise ValueError(f"cannot write certificates to {args.out!r}: {exc.strerror}") from None
    if args.json:
        print(cert.to_json())
    else:
        print(summary_table(cert.results))
        for n in cert.not_run:
            print(f"not run: {n['id']} ({n['title']}): {n['reason']}")
        print(f"\n{'PASSED' if cert.passed else 'FAILED'}; wrote {', '.join(map(str, paths))}")
    return 0 if cert.passed else 1


def run_geometries(args: argparse.Namespace) -> int:
    from proofs_checks.geometry_table import describe, describe_bytes, format_table
    from proofs_checks.memory import require_memory

    if not (1 <= args.r <= min(args.m, args.n)):
        raise ValueError(f"needs 1 ≤ r ≤ min(m, n), got m={args.m}, n={args.n}, r={args.r}")
    require_memory(
        f"rattn geometries at m={args.m}, n={args.n}, r={args.r}",
        describe_bytes(args.m, args.n, args.r),
    )
    rows = describe(args.m, args.n, args.r)
    print(json.dumps(rows, indent=2, ensure_ascii=False) if args.json else format_table(rows))
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``rattn compare``: bad usage (unknown dtype or device, CUDA missing, no torch) exits 2
    before anything runs; a case beyond its bound exits 1."""
    try:
        from proofs_checks import port_compare
    except ImportError as exc:
        raise ValueError(f"rattn compare needs torch (pip install 'rattn[torch]'): {exc}") from None
    dtypes = port_compare.parse_dtypes(args.dtype)
    port_compare.check_device(args.device)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be ≥ 1, got {args.steps}")
    if args.seed < 0:
        raise ValueError(f"--seed must be ≥ 0, got {args.seed}")
    port_compare.select(args.geometry)  # unknown geometry: bad usage
    try:
        result = port_compare.compare(
            args.device,
            dtypes,
            args.steps,
            args.seed,
            geometries=args.geometry,
            full=args.full,
            progress=not args.json,
        )
    except ValueError as exc:  # raised by a run, not by the arguments: a failure
        print(f"rattn compare: a case raised: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(port_compare.format_table(result))
    return 0 if result["passed"] else 1


def run_verify(args: argparse.Namespace) -> int:
    """``rattn verify CERT.json``: 0 when every field matches, 1 otherwise (each difference
    named), 2 for a file that is not a certificate or cannot be read safely."""
    from proofs_checks.verify import format_verify, verify

    result = verify(args.certificate, progress=not args.json)
    print(json.dumps(result, indent=2) if args.json else format_verify(result))
    return 0 if result["matches"] else 1


def run_audit(args: argparse.Namespace) -> int:
    """``rattn audit TRACE``: 0 when the run PASSED (every row passes: within its bound, and
    the bound at most a tenth of the step), 1 when it FAILED or is NOT AUDITABLE, 2 for a trace
    that cannot be read or replayed (or no matplotlib for ``--plot``). NumPy only: torch is not
    needed to replay a trace."""
    from proofs_checks.audit import replay as audit
    from proofs_checks.audit import report as audit_report

    plot = None
    if args.plot is not None:
        from proofs_checks.cli.rank import plot_destination, require_matplotlib

        require_matplotlib()
        plot = plot_destination(args.plot, "audit.png")
    if args.set and args.rule is None:
        raise ValueError("--set needs --rule NAME")
    try:
        claim = None if args.rule is None else audit.Claim(args.rule, parse_overrides(args.set))
        result = audit.audit(args.trace, progress=not args.json, claim=claim)
        if plot is not None:
            result["plot"] = str(audit_report.plot(result, plot))
    except audit.TraceError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(audit_report.format_table(result))
        if plot is not None:
            print(f"plot: {plot}")
    return 0 if result["passed"] else 1


def run_conform(args: argparse.Namespace) -> int:
    """``rattn conform MODULE:FACTORY``: 0 when every claimed property holds, 1 when one does
    not, 2 for bad usage or a factory that cannot be imported or called."""
    _require_torch("rattn conform")
    from proofs_checks.conformance import conform, parse_claims, report

    settings = parse_overrides(args.set)
    claims = parse_claims(args.claims)
    if args.out is not None:
        check_destination(args.out, report.FILES)
    # what the target prints goes to stderr: stdout is the report (one JSON document)
    with contextlib.redirect_stdout(sys.stderr):
        result = conform(
            args.target,
            geometry=args.geometry,
            rule=args.rule,
            settings=settings,
            claims=claims,
            dtype=args.dtype,
            seed=args.seed,
            progress=not args.json,
        )
    if args.out is not None:
        report.write(result, args.out)
    print(
        json.dumps(result, indent=2, ensure_ascii=False)
        if args.json
        else report.to_markdown(result)
    )
    return 0 if result["passed"] else 1


def _require_torch(command: str) -> None:
    """ValueError (exit 2) naming the command when torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"{command} needs torch (pip install 'rattn[torch]'): {exc}") from None


def _run_torch_bench(
    args: argparse.Namespace,
    bench: Callable[..., dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """``rattn bench NAME`` of a torch benchmark run at its defaults but ``repeats`` (5 unless
    given): ``bench(repeats=..., progress=...)`` printed as JSON or by ``render``; 0."""
    _require_torch(f"rattn bench {args.name}")
    repeats = 5 if args.repeats is None else args.repeats
    result = bench(repeats=repeats, progress=not args.json)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from proofs_checks.bench import (
        bench_geometries,
        bench_stiefel,
        format_bench,
        format_geometries,
    )

    if args.name == "port":
        from proofs_checks.bench import bench_port, check_port_sizes, format_port

        check_port_sizes(args.d, args.r)  # sizes and memory, before torch is imported
        _require_torch("rattn bench port")
        repeats = 5 if args.repeats is None else args.repeats
        dtypes = tuple(args.dtype.split(",")) if args.dtype else ("float32", "float64")
        result = bench_port(
            d=args.d,
            r=args.r,
            repeats=repeats,
            progress=not args.json,
            dtypes=dtypes,
            device=args.device,
        )
        print(json.dumps(result, indent=2) if args.json else format_port(result))
        return 0

    if args.name == "train":
        from proofs_checks.bench.train import bench_train, check_train_memory, format_train

        check_train_memory(args.size)  # before torch is imported
        _require_torch("rattn bench train")
        result = bench_train(
            5 if args.repeats is None else args.repeats,
            size=args.size,
            device=args.device,
            progress=not args.json,
        )
        print(json.dumps(result, indent=2) if args.json else format_train(result))
        return 0

    if args.name == "model":
        from proofs_checks.bench.model import bench_model, check_model_memory, format_model

        check_model_memory(("float32", "float64"))  # before torch is imported
        return _run_torch_bench(args, bench_model, format_model)

    if args.name == "audit":
        from proofs_checks.bench.audit import bench_audit, format_audit

        return _run_torch_bench(args, bench_audit, format_audit)

    if args.name == "geometries":
        if not (1 <= args.r <= min(args.m, args.n)):
            raise ValueError(
                f"bench geometries needs 1 ≤ r ≤ min(m, n), got m={args.m}, n={args.n}, r={args.r}"
            )
        repeats = 10 if args.repeats is None else args.repeats
        result = bench_geometries(args.m, args.n, args.r, repeats, progress=not args.json)
        print(json.dumps(result, indent=2) if args.json else format_geometries(result))
        return 0
    if not (1 <= args.r <= args.d):
        raise ValueError(f"bench stiefel needs 1 ≤ r ≤ d, got d={args.d}, r={args.r}")
    repeats = 30 if args.repeats is None else args.repeats
    result = bench_stiefel(args.d, args.r, repeats, progress=not args.json)
    print(json.dumps(result, indent=2) if args.json else format_bench(result))
    return 0


class _LineEndTracker:
    """``sys.stderr`` while ``main`` runs, noting whether what was last written to it ended
    its line: a progress bar drawn with ``\r`` leaves the line open (and tqdm leaves it open
    for good when Ctrl-C lands inside its constructor, after it has drawn the bar but before a
    ``with`` holds it). Set before each write, so an interrupt mid-write errs towards a
    newline."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.mid_line = False

    def write(self, text: str) -> int:
        if text:
            self.mid_line = True
        written = self.stream.write(text)
        if text:
            self.mid_line = not text.endswith("\n")
        return written

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rattn`` console script. Ctrl-C at any moment (while parsing, a
    check, a progress bar being drawn, or the certificates being written) exits 130 with
    ``rattn: interrupted`` on a line of its own, no traceback; certificates are not touched."""
    stderr, tracker = sys.stderr, None
    try:
        sys.stderr = tracker = _LineEndTracker(stderr)
        early_interrupt.release()  # from here on, Ctrl-C is a KeyboardInterrupt handled below
        return _main(argv)
    except KeyboardInterrupt:
        end = "\n" if tracker is not None and tracker.mid_line else ""
        print(f"{end}{early_interrupt.MESSAGE}", file=stderr, flush=True)
        return INTERRUPTED
    finally:
        sys.stderr = stderr


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        commands = {
            "certify": run_certify,
            "geometries": run_geometries,
            "compare": run_compare,
            "audit": run_audit,
            "verify": run_verify,
            "bench": run_bench,
            "rank": run_rank_command,
            "experiment": run_experiment,
            "conform": run_conform,
        }
        return commands[args.command](args)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ValueError as exc:  # bad input named by the library: report it, no traceback
        print(f"rattn: error: {exc}", file=sys.stderr)
        return 2


def certify_main(argv: Sequence[str] | None = None) -> int:
    """``python -m proofs_checks ARGS`` means ``rattn certify ARGS``."""
    return main(["certify", *(sys.argv[1:] if argv is None else argv)])
