"""The report of ``rattn audit``: a Markdown table (the worst element of each step and group)
and a plot of deviation/bound over the steps (``proofs_checks.audit.replay`` replays)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proofs_checks.audit.errors import TraceError
from proofs_checks.audit.pooled import pooled_line
from proofs_checks.audit.verdicts import RESOLUTION, row_ratio


def worst_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (step, group): its worst element (a failing one first)."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for row in result["steps"]:
        key = (row["step"], row["group"])
        old = best.get(key)
        if old is None or _rank(row) > _rank(old):
            best[key] = row
    return [best[k] for k in sorted(best)]


def _rank(row: dict[str, Any]) -> tuple[int, float]:
    """A failing row first, then a row that is not auditable, then the largest ratio."""
    return ({"fail": 2, "not auditable": 1}.get(row["verdict"], 0), row_ratio(row))


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.1e}"


def _parameter(row: dict[str, Any]) -> str:
    """The parameter(s) holding a point: their names (the module said once for labels such as
    "transformer.h.0.attn W_O", "… S_VO", "… W_V"), else their indices in the group."""
    names = row["names"]
    if not names:
        return ", ".join(map(str, row["params"]))
    modules = {n.rpartition(" ")[0] for n in names}
    if len(modules) == 1 and all(" " in n for n in names):
        return f"{modules.pop()} {', '.join(n.rpartition(' ')[2] for n in names)}"
    return ", ".join(names)


def _claimed(result: dict[str, Any]) -> str:
    rule = result.get("rule")
    if not rule:
        return ""
    settings = ", ".join(f"{k}={v}" for k, v in sorted(rule["settings"].items()))
    return f" against the claimed rule {rule['name']}" + (f" ({settings})" if settings else "")


def format_table(result: dict[str, Any]) -> str:
    """Markdown table of an audit: per step and group the worst element, then the verdict."""
    lines = [
        f"Audit of {result['trace']} ({result['optimizer']}), every step replayed through the "
        f"float64 reference{_claimed(result)}:",
        "",
        "| step | group | geometry | dtype | parameter | element | ‖x − x̄‖ (projected) "
        "| step Δ | ‖y − ȳ‖ | bound | state/bound | result |",
        "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in worst_rows(result):
        verdict = {"pass": "pass", "fail": "FAIL"}.get(r["verdict"], r["verdict"])
        if r["reason"]:
            verdict += f" ({r['reason']})"
        state = "—" if r["state_ratio"] is None else f"{r['state_ratio']:.2f}"
        lines.append(
            f"| {r['step']} | {r['group']} | {r['geometry']} | {r['dtype'].removeprefix('torch.')} "
            f"| {_parameter(r)} | {r['element']} | {_num(r.get('projection'))} "
            f"| {_num(r.get('step_length'))} "
            f"| {_num(r['deviation'])} | {_num(r['bound'])} | {state} | {verdict} |"
        )
    counts, total = result["counts"], len(result["steps"])
    lines += ["", summary_line(result)]
    if result["partial"]:
        lines.append(
            "PARTIAL: the recording was not closed (killed, out of disk, or no close()); the "
            f"steps written before it stopped were replayed, up to step {max_step(result)}"
        )
    lines.append(
        f"rows: {counts['pass']} pass, {counts['fail']} fail, {counts['not auditable']} not "
        f"auditable, of {total} (a pass needs a bound ≤ {RESOLUTION:g} of its step's length)"
    )
    lines.append(pooled_line(result["pooled"]))
    return "\n".join(lines)


def max_step(result: dict[str, Any]) -> int | None:
    return max((r["step"] for r in result["steps"]), default=None)


def summary_line(result: dict[str, Any]) -> str:
    """PASSED, FAILED (with the first failing step) or NOT AUDITABLE (with the first step that
    is not, or the reason that no step was replayed)."""
    if result["verdict"] == "passed":
        return "PASSED"
    if result["verdict"] == "failed":
        n = result["counts"]["fail"]
        first = result["first_failure_step"]
        flagged = [t["step"] for t in result["pooled"]["flagged"]]
        if not n:
            return f"FAILED: the pooled test flagged step {', '.join(map(str, flagged))}"
        pooled = f", the pooled test step {', '.join(map(str, flagged))}" if flagged else ""
        return f"FAILED: {n} of {len(result['steps'])} elements{pooled}, first at step {first}"
    step = result["first_unauditable_step"]
    if step is None:
        return "NOT AUDITABLE: no step was replayed (every recorded step was skipped)"
    n = result["counts"]["not auditable"]
    return f"NOT AUDITABLE: {n} of {len(result['steps'])} elements, first at step {step}"


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """deviation/bound (and the state's ratio) over steps, per group, on a log scale (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    rows = worst_rows(result)
    for gi in sorted({r["group"] for r in rows}):
        mine = [r for r in rows if r["group"] == gi and r["deviation"] is not None and r["bound"]]
        if not mine:  # only skipped steps
            continue
        steps = [r["step"] for r in mine]
        ratio = [max(r["deviation"] / r["bound"], 1e-20) for r in mine]
        ax.plot(steps, ratio, marker=".", label=f"group {gi} ({mine[0]['geometry']}): point")
        state = [(r["step"], r["state_ratio"]) for r in mine if r["state_ratio"] is not None]
        if state:
            ax.plot(*zip(*state, strict=True), ls="--", marker="x", label=f"group {gi}: state")
    ax.axhline(1.0, color="red", lw=1, label="bound")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("deviation / bound")
    verdict = summary_line(result).split(":")[0].lower()
    ax.set_title(f"rattn audit: {Path(result['trace']).name}, {verdict}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise TraceError(f"cannot write the plot to {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return path
