"""ASCII LaTeX for pdflatex: text with Unicode mathematics (check names, hypotheses, details)
written as LaTeX commands, Greek and other symbols in math mode.

``text(s)`` escapes LaTeX's special characters and writes every non-ASCII character of ``SYMBOLS``
as ``\\ensuremath{...}`` (valid in text and in math, so symbols may sit side by side), dashes and
quotes as text; ``math(s)`` does the same for a string that is LaTeX already (a statement), without
escaping. A character outside the table becomes ``\\textbf{?}`` and is listed by ``unknown`` (the
tests keep the registry's texts free of them). A combining circumflex (U+0302) puts a hat on the
character before it.
"""

from __future__ import annotations

#: Non-ASCII character -> its LaTeX in math mode.
SYMBOLS: dict[str, str] = {
    **{
        g: "\\" + name
        for g, name in zip(
            "αβγδηθκλμνξπρστφχψωΓΔΘΛΞΠΣΦΨΩ",
            "alpha beta gamma delta eta theta kappa lambda mu nu xi pi rho sigma tau phi chi psi "
            "omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split(),
            strict=True,
        )
    },
    "ε": r"\varepsilon",
    "±": r"\pm",
    "·": r"\cdot",
    "×": r"\times",
    "½": r"\tfrac{1}{2}",
    "¾": r"\tfrac{3}{4}",
    "ᵀ": r"^{\top}",
    "‖": r"\|",
    "∥": r"\|",
    "ℝ": r"\mathbb{R}",
    "←": r"\leftarrow",
    "→": r"\to",
    "↦": r"\mapsto",
    "∂": r"\partial",
    "∇": r"\nabla",
    "∈": r"\in",
    "−": "-",
    "√": r"\surd",
    "≠": r"\neq",
    "≤": r"\le",
    "≥": r"\ge",
    "≈": r"\approx",
    "≫": r"\gg",
    "≪": r"\ll",
    "≻": r"\succ",
    "⪯": r"\preceq",
    "⟨": r"\langle",
    "⟩": r"\rangle",
    "∞": r"\infty",
    "∑": r"\sum",
    "⊗": r"\otimes",
    "∩": r"\cap",
    "∝": r"\propto",
    "𝓗": r"\mathcal{H}",
    "ℰ": r"\mathcal{E}",
    "Ŷ": r"\hat{Y}",
    "…": r"\ldots",
    **{d: f"^{{{i}}}" for i, d in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")},
    **{d: f"_{{{i}}}" for i, d in enumerate("₀₁₂₃₄₅₆₇₈₉")},
    "⁻": "^{-}",
    "ᵢ": "_{i}",
}

#: Non-ASCII characters written as text.
TEXT: dict[str, str] = {"—": "---", "–": "--", "’": "'", "‘": "`", "“": "``", "”": "''"}

_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
}

HAT = "\u0302"


def _convert(s: str, escape: bool) -> str:
    out: list[str] = []
    chars = list(str(s))
    for i, ch in enumerate(chars):
        if ch == HAT:
            continue
        hat = i + 1 < len(chars) and chars[i + 1] == HAT
        if ch in SYMBOLS:
            body = SYMBOLS[ch]
        elif ord(ch) < 128:
            if not hat:
                out.append(_SPECIAL.get(ch, ch) if escape else ch)
                if escape and ch == "_":
                    out.append(BREAK)
                continue
            body = ch
        elif ch in TEXT and not hat:
            out.append(TEXT[ch])
            continue
        else:
            out.append(r"\textbf{?}")
            continue
        out.append(rf"\ensuremath{{\hat{{{body}}}}}" if hat else rf"\ensuremath{{{body}}}")
    return "".join(out)


#: A line break allowed, and no space: after every escaped underscore (identifiers such as
#: block_partial_isometry_embedded have no other break point) and inside long codes.
BREAK = r"\allowbreak{}"


def text(s: str) -> str:
    """``s`` as pdflatex-safe LaTeX text (module docstring); a line may break after ``_``."""
    return _convert(s, escape=True)


def math(s: str) -> str:
    """``s``, LaTeX already, with its non-ASCII characters written as commands; a line may
    break after an escaped underscore ``\\_``."""
    return _convert(s, escape=False).replace("\\_", "\\_" + BREAK)


def code(s: str, every: int = 16) -> str:
    """``s`` (a hash, a commit) in typewriter type, with a line break allowed after every
    ``every`` characters: a 64-digit hash is wider than a column."""
    chunks = [text(s[i : i + every]) for i in range(0, len(s), every)] or [""]
    return r"\texttt{" + BREAK.join(chunks) + "}"


def unknown(s: str) -> set[str]:
    """The non-ASCII characters of ``s`` that the tables do not cover."""
    return {ch for ch in str(s) if ord(ch) >= 128 and ch not in SYMBOLS and ch not in TEXT} - {HAT}
