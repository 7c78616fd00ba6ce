"""Machine-checked checks: Coq proofs of the algebra behind the propositions.

``coq/Propositions.v`` states and proves, for every size and over any ``numFieldType`` of
MathComp, the identities the float64, mpmath and symbolic checks measure at finitely many
points: the Stiefel projection is tangent, idempotent and self-adjoint (GEO-stiefel), the
steepest-descent identity ⟨G, ξ⟩ = ⟨P_W G, ξ⟩ on the tangent space (RA-1), the Gram identity of
the polar retraction (RA-3), P_W(W) = 0 (RA-5), the gauge identity (RA-6) and the orthogonality
of the projected factors of R1 and P1.

A check compiles the file with ``coqc`` and then asks Coq for the assumptions of each lemma it
names (``Print Assumptions``) and for its statement and the definitions it rests on, printed in
full (``Set Printing All``): it passes only when every lemma is closed under the global context
and Coq prints exactly the statements and definitions of ``coq_statements``, so a lemma that is
``Admitted``, rests on an axiom, or proves an easier statement under the same name fails, and so
does a file that does not compile or defines anything beyond the pinned definitions. Its
negative control compiles the same file with the statement made false (a hypothesis removed, a
transpose moved, the ½ of sym dropped): the same test must fail.

The file is compiled once per text (the base text and each control's variant), all of them at
once on first use, in parallel; ``coqc`` not on the path makes the checks *not run*
(``registry.Check.requires``), never passed.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from proofs_checks.coq_statements import DEFINITIONS, PINNED
from proofs_checks.registry import Check, Context, Outcome

#: The proof file and the tool that checks it.
PROOFS = Path(__file__).resolve().parent / "coq" / "Propositions.v"
COQC = "coqc"
#: A compile of the file takes about 2 s (loading MathComp); past this it is refused.
TIMEOUT_S = 300
#: What Coq prints for a lemma that needs no axiom.
CLOSED = "Closed under the global context"


@dataclass(frozen=True)
class Control:
    """A false variant of one lemma: ``old`` (which must occur exactly once in the file)
    replaced by ``new`` makes the lemma's statement false; ``words`` say how."""

    lemma: str
    old: str
    new: str
    words: str


@dataclass(frozen=True)
class Proof:
    """One check: its name, the lemmas of ``coq/Propositions.v`` it asserts, and one control
    per lemma."""

    name: str
    lemmas: tuple[str, ...]
    controls: tuple[Control, ...]

    @property
    def control(self) -> str:
        return "; ".join(f"{c.lemma}: {c.words}" for c in self.controls) + ", in the proof file"


def _hypothesis_removed(lemma: str, old: str, new: str, what: str = "WᵀW = I") -> Control:
    return Control(lemma, old, new, f"the hypothesis {what} removed")


#: The checks, by proposition.
PROOFS_BY_ID: dict[str, Proof] = {
    "GEO-stiefel": Proof(
        "P_W(Z) tangent, P_W idempotent and self-adjoint, every d ≥ r (Coq)",
        ("tangent_proj", "proj_idem", "proj_adjoint"),
        (
            _hypothesis_removed(
                "tangent_proj",
                "Lemma tangent_proj W Z : W^T *m W = 1%:M -> tangent W (proj W Z).",
                "Lemma tangent_proj W Z : tangent W (proj W Z).",
            ),
            _hypothesis_removed(
                "proj_idem",
                "Lemma proj_idem W Z : W^T *m W = 1%:M -> proj W (proj W Z) = proj W Z.",
                "Lemma proj_idem W Z : proj W (proj W Z) = proj W Z.",
            ),
            Control(
                "proj_adjoint",
                "\\tr ((proj W Z)^T *m Y) = \\tr (Z^T *m proj W Y).",
                "\\tr ((proj W Z)^T *m Y) = \\tr (Z^T *m Y).",
                "P_W dropped from one side",
            ),
        ),
    ),
    "RA-1": Proof(
        "⟨G, ξ⟩ = ⟨P_W(G), ξ⟩ for tangent ξ, every d ≥ r (Coq)",
        ("steepest",),
        (
            _hypothesis_removed(
                "steepest",
                "Lemma steepest W G X : tangent W X ->",
                "Lemma steepest W G X :",
                "tangent ξ",
            ),
        ),
    ),
    "RA-3": Proof(
        "(W + ξ)ᵀ(W + ξ) = I + ξᵀξ, every d ≥ r (Coq)",
        ("gram_step",),
        (
            _hypothesis_removed(
                "gram_step",
                "Lemma gram_step W X : W^T *m W = 1%:M -> tangent W X ->",
                "Lemma gram_step (W X : 'M[R]_(d, r)) : W^T *m W = 1%:M ->",
                "tangent ξ",
            ),
        ),
    ),
    "RA-5": Proof(
        "P_W(W) = 0 and P_W(G + cW) = P_W(G), every d ≥ r (Coq)",
        ("proj_self", "coupled_decay"),
        (
            _hypothesis_removed(
                "proj_self",
                "Lemma proj_self W : W^T *m W = 1%:M -> proj W W = 0.",
                "Lemma proj_self W : proj W W = 0.",
            ),
            _hypothesis_removed(
                "coupled_decay",
                "Lemma coupled_decay W G (c : R) : W^T *m W = 1%:M -> proj W (G + c *: W)",
                "Lemma coupled_decay W G (c : R) : proj W (G + c *: W)",
            ),
        ),
    ),
    "RA-6": Proof(
        "skew(W_QᵀHW_K + W_KᵀHᵀW_Q) = 0 and the gauge orbit, every d ≥ r (Coq)",
        ("gauge_gradient", "gauge_orbit"),
        (
            Control(
                "gauge_gradient",
                "WK^T *m (H^T *m WQ)) = 0.",
                "WK^T *m (H *m WQ)) = 0.",
                "a transpose moved in the gradient of W_K (Hᵀ W_Q → H W_Q)",
            ),
            _hypothesis_removed(
                "gauge_orbit",
                "Q *m Q^T = 1%:M -> (WQ *m Q) *m (WK *m Q)^T = WQ *m WK^T.",
                "(WQ *m Q) *m (WK *m Q)^T = WQ *m WK^T.",
                "Q Qᵀ = I",
            ),
        ),
    ),
    "R1/P1": Proof(
        "Uᵀ(I − UUᵀ)A = 0: the projected factors are orthogonal to U, V (Coq)",
        ("complement_orthogonal",),
        (
            _hypothesis_removed(
                "complement_orthogonal",
                "U^T *m U = 1%:M -> U^T *m (A - U *m (U^T *m A)) = 0.",
                "U^T *m (A - U *m (U^T *m A)) = 0.",
                "UᵀU = I",
            ),
        ),
    ),
}


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the machine-checked checks cannot run here (coqc not on the path, or MathComp not
    in its library), or None."""
    if shutil.which(COQC) is None:
        return f"needs {COQC} (Coq with MathComp), which is not on the path"
    try:
        where = subprocess.run([COQC, "-where"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{COQC} -where failed: {exc}"
    if not (Path(where.stdout.strip()) / "user-contrib" / "mathcomp").is_dir():
        return f"needs MathComp, which is not in {COQC}'s library ({where.stdout.strip()})"
    return None


def source() -> str:
    return PROOFS.read_text(encoding="utf-8")


def variant(text: str, control: Control) -> str:
    """The file with the control's statement: ``control.old`` (exactly once) replaced."""
    if text.count(control.old) != 1:
        raise ValueError(f"control text {control.old!r} occurs {text.count(control.old)} times")
    return text.replace(control.old, control.new)


def proof_lines(text: str, lemma: str) -> range:
    """The lines (from 1) of ``lemma``'s proof in ``text``: from its ``Proof.`` to its
    ``Qed.`` (an error on the statement's own lines is a slip, not a refutation)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"Lemma {lemma} "))
    start = next(i for i in range(start, len(lines)) if "Proof." in lines[i])
    end = next(i for i in range(start, len(lines)) if "Qed." in lines[i])
    return range(start + 1, end + 2)


def refuted(text: str, control: Control) -> tuple[bool, str]:
    """(whether Coq rejects the false variant inside its own proof, coqc's status): the file
    with ``control`` applied must fail to compile at a line of that lemma's proof, so that
    neither a slip (a syntax or type error, elsewhere or in the statement) nor the statement
    pin (which any edit trips) can stand in for Coq finding the statement unprovable."""
    changed = variant(text, control)
    _, status = closed_lemmas(changed, (control.lemma,))
    where = re.match(r"does not compile \(line (\d+)", status)
    inside = where is not None and int(where.group(1)) in proof_lines(changed, control.lemma)
    return inside, status


def _with_queries(text: str, lemmas: tuple[str, ...], nonce: str) -> str:
    """The file followed by Coq's answers to read, each after a marker carrying ``nonce``:
    with every notation and implicit argument printed (``Set Printing All``), each pinned
    definition's body (``Print``), and per lemma its statement (``Check``) and its assumptions
    (``Print Assumptions``)."""

    def marked(what: str, command: str) -> str:
        return f'\nGoal True. idtac "@@ {nonce} {what}". Abort.\n{command}'

    queries = "\nSet Printing All."
    queries += "".join(marked(f"def {name}", f"Print {name}.") for name in DEFINITIONS)
    for name in lemmas:
        queries += marked(f"statement {name}", f"Check {name}.")
        queries += marked(f"assumptions {name}", f"Print Assumptions {name}.")
    return text + queries + marked("end", "") + "\n"


def _answers(stdout: str, nonce: str) -> dict[str, str]:
    """What Coq printed after each of ``nonce``'s markers, up to the next one, whitespace
    collapsed: {"def proj": ..., "statement steepest": ..., "assumptions steepest": ...}."""
    parts = re.split(rf"^@@ {nonce} (.+)$", stdout, flags=re.M)
    return {parts[i].strip(): " ".join(parts[i + 1].split()) for i in range(1, len(parts) - 1, 2)}


#: Text a proof file may not hold: what would let it accept a statement it did not prove or
#: print its own verdict (an admission, an axiom, a section hypothesis that becomes a premise,
#: a module that shadows a lemma's name, a redefined tactic or notation, a kernel check off).
#: The file is read as text before it is compiled; a file holding one is refused.
FORBIDDEN = (
    "Admitted",
    "Axiom",
    "Parameter",
    "Hypothes",
    "Conjecture",
    "Module",
    "Ltac",
    "Notation",
    "Unset",
    "bypass_check",
    "checking",
    "Guard",
    "idtac",
    "Print",
    "Declare",
    # what could give a name the statements use another meaning than the one pinned
    "Fixpoint",
    "Inductive",
    "Record",
    "Structure",
    "Class",
    "Instance",
    "Canonical",
    "Coercion",
    "Variant",
    "Hint",
    "Program",
    "Existing",
    "Opaque",
    "Transparent",
    "Strategy",
)


def _refusal(text: str) -> str | None:
    """Why the proof file is refused before it is compiled: a FORBIDDEN word, or a definition
    other than the pinned ones (it could shadow a name the statements print the same)."""
    if found := [c for c in FORBIDDEN if c in text]:
        return f"the file holds {', '.join(found)}"
    defined = re.findall(r"\bDefinition\s+([^\s(:]+)", text)
    if extra := sorted(set(defined) - set(DEFINITIONS)):
        return f"the file defines {', '.join(extra)}, beside the pinned {', '.join(DEFINITIONS)}"
    return None


@functools.lru_cache(maxsize=32)
def closed_lemmas(text: str, lemmas: tuple[str, ...]) -> tuple[frozenset[str], str]:
    """(the lemmas proved as pinned, coqc's status) for the file ``text``: a lemma counts when
    Coq reports it closed under the global context, its statement is ``coq_statements``' and
    every pinned definition is too; none when the file does not compile or is refused
    (``_refusal``). Coq's answers are read only after markers carrying a fresh random nonce."""
    if why := _refusal(text):
        return frozenset(), f"refused: {why}"
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rattn-coq-") as tmp:
        path = Path(tmp) / PROOFS.name
        path.write_text(_with_queries(text, lemmas, nonce), encoding="utf-8")
        try:
            run = subprocess.run(
                [COQC, "-q", "-w", "-all", path.name],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return frozenset(), f"coqc did not finish: {exc}"
    if run.returncode != 0:
        return frozenset(), "does not compile (" + _first_error(run.stderr + run.stdout) + ")"
    said = _answers(run.stdout, nonce)
    moved = [n for n in DEFINITIONS if said.get(f"def {n}") != PINNED[n]]
    if moved:
        return frozenset(), f"compiles, but defines {', '.join(moved)} otherwise than pinned"
    closed = {
        name
        for name in lemmas
        if said.get(f"assumptions {name}") == CLOSED
        and said.get(f"statement {name}") == PINNED[name]
    }
    return frozenset(closed), "compiles"


def _first_error(log: str) -> str:
    """Where coqc stopped and the first words of its message: 'line 89: Error: No assumption
    in ...'."""
    where = re.search(r"line (\d+)", log)
    message = re.search(r"Error:\s*(.*)", log, re.S)
    words = " ".join(message.group(1).split()[:8]) if message else "no message"
    return f"line {where.group(1) if where else '?'}: {words}"


def _warm() -> None:
    """Compile the base file and every control's variant at once, in parallel (each compile is
    mostly MathComp's loading, single-threaded)."""
    text = source()
    jobs = [(text, p.lemmas) for p in PROOFS_BY_ID.values()]
    jobs += [(variant(text, c), (c.lemma,)) for p in PROOFS_BY_ID.values() for c in p.controls]
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda job: closed_lemmas(*job), jobs))


@functools.lru_cache(maxsize=1)
def coq_versions() -> dict[str, str | None]:
    """The versions of coqc and of Debian's MathComp package (None where unknown)."""
    versions: dict[str, str | None] = {"coq": None, "mathcomp": None}
    try:
        out = subprocess.run([COQC, "--version"], capture_output=True, text=True, timeout=60)
        words = out.stdout.split()
        versions["coq"] = words[words.index("version") + 1] if "version" in words else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "libcoq-mathcomp"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        versions["mathcomp"] = out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return versions


def check(key: str) -> Callable[[Context, bool], Outcome]:
    """The machine-checked check of ``PROOFS_BY_ID[key]``: residual the number of its lemmas
    not closed under the global context (all of them when the file does not compile),
    tolerance 0. Control: each lemma's false variant (``Proof.controls``) must be refuted by
    Coq inside that lemma (``refuted``); residual the number refuted, tolerance one fewer than
    the controls, so the control is rejected only when every variant is."""
    proof = PROOFS_BY_ID[key]

    def run(ctx: Context, wrong: bool) -> Outcome:
        """Compile ``coq/Propositions.v`` with coqc and ask Coq for the assumptions of each
        lemma of the check (the control: compile each lemma's false variant); residual and
        tolerance as in ``check``."""
        _warm()
        text = source()
        versions = coq_versions()
        exercised = {
            "sizes": "every d ≥ r (and m, k) over any numFieldType",
            "dtypes": "exact (Coq's kernel)",
            "seeds": "none (a proof)",
            "lemmas": ", ".join(proof.lemmas),
            "tools": f"Coq {versions['coq']}, MathComp {versions['mathcomp']}",
            "proof file": f"{PROOFS.name} sha256 " + hashlib.sha256(text.encode()).hexdigest()[:16],
        }
        if wrong:
            verdicts = [(c, *refuted(text, c)) for c in proof.controls]
            held = [c.lemma for c, inside, _ in verdicts if not inside]
            return Outcome(
                bool(held),
                float(len(verdicts) - len(held)),
                float(len(verdicts) - 1),
                "; ".join(f"{c.lemma}: {status}" for c, _, status in verdicts)
                + (f"; not refuted inside its lemma: {', '.join(held)}" if held else ""),
                exercised=exercised,
            )
        closed, status = closed_lemmas(text, proof.lemmas)
        missing = [name for name in proof.lemmas if name not in closed]
        return Outcome(
            not missing,
            float(len(missing)),
            0.0,
            f"{PROOFS.name} {status}; "
            + (f"not closed: {', '.join(missing)}" if missing else "every lemma closed"),
            exercised=exercised,
        )

    run.__name__ = f"machine_checked_{key.replace('-', '_').replace('/', '_')}"
    return run


def machine_check(key: str) -> Check:
    """The ``machine-checked`` check of ``PROOFS_BY_ID[key]`` (not run without coqc)."""
    proof = PROOFS_BY_ID[key]
    return Check("machine-checked", proof.name, check(key), proof.control, unavailable=unavailable)
