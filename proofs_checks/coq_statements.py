"""The statements the machine-checked checks hold ``coq/Propositions.v`` to, kept here and not
read from the file: each pinned definition's body and each checked lemma's statement as Coq
prints them with every notation and implicit argument spelled out (``Set Printing All``),
whitespace collapsed. A proof file passes a check only when Coq prints exactly these, so a file
cannot prove an easier statement under the same name or give sym, proj, tangent or skew another
meaning. The readable forms are the lemmas' statements in the file (e.g. ``steepest``: for
tangent X at W, tr(GᵀX) = tr(P_W(G)ᵀX)); an edit of a statement there must be made here too.
"""

#: The definitions the statements rest on (the only definitions a proof file may make).
DEFINITIONS = ("sym", "proj", "tangent", "skew")

PINNED: dict[str, str] = {
    "sym": (
        "sym = fun (R : Num.NumField.type) (r : nat) (A : matrix (Num.NumField.sort R) r r) => "
        "@GRing.scale (GRing.UnitRing.ringType (Num.NumField.unitRingType R)) (matrix_lmodType "
        "(GRing.UnitRing.ringType (Num.NumField.unitRingType R)) r r) (@GRing.inv "
        "(Num.NumField.unitRingType R) (@intmul (GRing.Ring.zmodType (GRing.UnitRing.ringType "
        "(Num.NumField.unitRingType R))) (GRing.one (GRing.UnitRing.ringType "
        "(Num.NumField.unitRingType R))) (Posz (S (S O))))) (@GRing.add (matrix_zmodType "
        "(Num.NumField.zmodType R) r r) A (@trmx (Num.NumField.sort R) r r A)) : forall (R : "
        "Num.NumField.type) (r : nat) (_ : matrix (Num.NumField.sort R) r r), matrix "
        "(Num.NumField.sort R) r r Arguments sym R [r]%nat_scope A%ring_scope"
    ),
    "proj": (
        "proj = fun (R : Num.NumField.type) (d r : nat) (W Z : matrix (Num.NumField.sort R) d "
        "r) => @GRing.add (matrix_zmodType (Num.NumField.zmodType R) d r) Z (@GRing.opp "
        "(matrix_zmodType (GRing.Ring.zmodType (Num.NumField.ringType R)) d r) (@mulmx "
        "(Num.NumField.ringType R) d r r W (@sym R r (@mulmx (Num.NumField.ringType R) r d r "
        "(@trmx (Num.NumField.sort R) d r W) Z)))) : forall (R : Num.NumField.type) (d r : nat)"
        " (_ : matrix (Num.NumField.sort R) d r) (_ : matrix (Num.NumField.sort R) d r), matrix"
        " (Num.NumField.sort R) d r Arguments proj R [d r]%nat_scope (W Z)%ring_scope"
    ),
    "tangent": (
        "tangent = fun (R : Num.NumField.type) (d r : nat) (W X : matrix (Num.NumField.sort R) "
        "d r) => @eq (GRing.Zmodule.sort (matrix_zmodType (GRing.Ring.zmodType "
        "(Num.NumField.ringType R)) r r)) (@GRing.add (matrix_zmodType (GRing.Ring.zmodType "
        "(Num.NumField.ringType R)) r r) (@mulmx (Num.NumField.ringType R) r d r (@trmx "
        "(Num.NumField.sort R) d r W) X) (@mulmx (Num.NumField.ringType R) r d r (@trmx "
        "(Num.NumField.sort R) d r X) W)) (GRing.zero (matrix_zmodType (GRing.Ring.zmodType "
        "(Num.NumField.ringType R)) r r)) : forall (R : Num.NumField.type) (d r : nat) (_ : "
        "matrix (Num.NumField.sort R) d r) (_ : matrix (Num.NumField.sort R) d r), Prop "
        "Arguments tangent R [d r]%nat_scope (W X)%ring_scope"
    ),
    "skew": (
        "skew = fun (R : Num.NumField.type) (r : nat) (A : matrix (Num.NumField.sort R) r r) =>"
        " @GRing.scale (GRing.UnitRing.ringType (Num.NumField.unitRingType R)) (matrix_lmodType"
        " (GRing.UnitRing.ringType (Num.NumField.unitRingType R)) r r) (@GRing.inv "
        "(Num.NumField.unitRingType R) (@intmul (GRing.Ring.zmodType (GRing.UnitRing.ringType "
        "(Num.NumField.unitRingType R))) (GRing.one (GRing.UnitRing.ringType "
        "(Num.NumField.unitRingType R))) (Posz (S (S O))))) (@GRing.add (matrix_zmodType "
        "(Num.NumField.zmodType R) r r) A (@GRing.opp (matrix_zmodType (Num.NumField.zmodType "
        "R) r r) (@trmx (Num.NumField.sort R) r r A))) : forall (R : Num.NumField.type) (r : "
        "nat) (_ : matrix (Num.NumField.sort R) r r), matrix (Num.NumField.sort R) r r "
        "Arguments skew R [r]%nat_scope A%ring_scope"
    ),
    "tangent_proj": (
        "tangent_proj : forall (R : Num.NumField.type) (d r : nat) (W : matrix (GRing.Ring.sort"
        " (Num.NumField.ringType R)) d r) (Z : matrix (Num.NumField.sort R) d r) (_ : @eq "
        "(matrix (GRing.Ring.sort (Num.NumField.ringType R)) r r) (@mulmx "
        "(Num.NumField.ringType R) r d r (@trmx (GRing.Ring.sort (Num.NumField.ringType R)) d r"
        " W) W) (@scalar_mx (Num.NumField.ringType R) r (GRing.one (Num.NumField.ringType "
        "R)))), @tangent R d r W (@proj R d r W Z)"
    ),
    "proj_idem": (
        "proj_idem : forall (R : Num.NumField.type) (d r : nat) (W : matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d r) (Z : matrix (Num.NumField.sort R) d r) (_ : @eq "
        "(matrix (GRing.Ring.sort (Num.NumField.ringType R)) r r) (@mulmx "
        "(Num.NumField.ringType R) r d r (@trmx (GRing.Ring.sort (Num.NumField.ringType R)) d r"
        " W) W) (@scalar_mx (Num.NumField.ringType R) r (GRing.one (Num.NumField.ringType "
        "R)))), @eq (matrix (Num.NumField.sort R) d r) (@proj R d r W (@proj R d r W Z)) (@proj"
        " R d r W Z)"
    ),
    "proj_adjoint": (
        "proj_adjoint : forall (R : Num.NumField.type) (d r : nat) (W Z : matrix "
        "(Num.NumField.sort R) d r) (Y : matrix (GRing.Ring.sort (Num.NumField.ringType R)) d "
        "r), @eq (GRing.Zmodule.sort (GRing.Ring.zmodType (Num.NumField.ringType R))) (@mxtrace"
        " (Num.NumField.ringType R) r (@mulmx (Num.NumField.ringType R) r d r (@trmx "
        "(Num.NumField.sort R) d r (@proj R d r W Z)) Y)) (@mxtrace (Num.NumField.ringType R) r"
        " (@mulmx (Num.NumField.ringType R) r d r (@trmx (Num.NumField.sort R) d r Z) (@proj R "
        "d r W Y)))"
    ),
    "steepest": (
        "steepest : forall (R : Num.NumField.type) (d r : nat) (W : matrix (Num.NumField.sort "
        "R) d r) (G : matrix (GRing.Ring.sort (Num.NumField.ringType R)) d r) (X : matrix "
        "(Num.NumField.sort R) d r) (_ : @tangent R d r W X), @eq (GRing.Zmodule.sort "
        "(GRing.Ring.zmodType (Num.NumField.ringType R))) (@mxtrace (Num.NumField.ringType R) r"
        " (@mulmx (Num.NumField.ringType R) r d r (@trmx (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d r G) X)) (@mxtrace (Num.NumField.ringType R) r (@mulmx "
        "(Num.NumField.ringType R) r d r (@trmx (Num.NumField.sort R) d r (@proj R d r W G)) "
        "X))"
    ),
    "gram_step": (
        "gram_step : forall (R : Num.NumField.type) (d r : nat) (W : matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d r) (X : matrix (Num.NumField.sort R) d r) (_ : @eq "
        "(matrix (GRing.Ring.sort (Num.NumField.ringType R)) r r) (@mulmx "
        "(Num.NumField.ringType R) r d r (@trmx (GRing.Ring.sort (Num.NumField.ringType R)) d r"
        " W) W) (@scalar_mx (Num.NumField.ringType R) r (GRing.one (Num.NumField.ringType R))))"
        " (_ : @tangent R d r W X), @eq (matrix (GRing.Ring.sort (Num.NumField.ringType R)) r "
        "r) (@mulmx (Num.NumField.ringType R) r d r (@trmx (GRing.Zmodule.sort "
        "(GRing.Ring.zmodType (Num.NumField.ringType R))) d r (@GRing.add (matrix_zmodType "
        "(GRing.Ring.zmodType (Num.NumField.ringType R)) d r) W X)) (@GRing.add "
        "(matrix_zmodType (GRing.Ring.zmodType (Num.NumField.ringType R)) d r) W X)) "
        "(@GRing.add (matrix_zmodType (GRing.Ring.zmodType (Num.NumField.ringType R)) r r) "
        "(@scalar_mx (Num.NumField.ringType R) r (GRing.one (Num.NumField.ringType R))) (@mulmx"
        " (Num.NumField.ringType R) r d r (@trmx (Num.NumField.sort R) d r X) X))"
    ),
    "proj_self": (
        "proj_self : forall (R : Num.NumField.type) (d r : nat) (W : matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d r) (_ : @eq (matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) r r) (@mulmx (Num.NumField.ringType R) r d r (@trmx "
        "(GRing.Ring.sort (Num.NumField.ringType R)) d r W) W) (@scalar_mx "
        "(Num.NumField.ringType R) r (GRing.one (Num.NumField.ringType R)))), @eq (matrix "
        "(Num.NumField.sort R) d r) (@proj R d r W W) (GRing.zero (matrix_zmodType "
        "(Num.NumField.zmodType R) d r))"
    ),
    "coupled_decay": (
        "coupled_decay : forall (R : Num.NumField.type) (d r : nat) (W : matrix "
        "(GRing.Ring.sort (Num.NumField.ringType R)) d r) (G : GRing.Zmodule.sort "
        "(@GRing.Lmodule.zmodType (Num.NumField.ringType R) (Phant (GRing.Ring.sort "
        "(Num.NumField.ringType R))) (matrix_lmodType (Num.NumField.ringType R) d r))) (c : "
        "Num.NumField.sort R) (_ : @eq (matrix (GRing.Ring.sort (Num.NumField.ringType R)) r r)"
        " (@mulmx (Num.NumField.ringType R) r d r (@trmx (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d r W) W) (@scalar_mx (Num.NumField.ringType R) r "
        "(GRing.one (Num.NumField.ringType R)))), @eq (matrix (Num.NumField.sort R) d r) (@proj"
        " R d r W (@GRing.add (@GRing.Lmodule.zmodType (Num.NumField.ringType R) (Phant "
        "(GRing.Ring.sort (Num.NumField.ringType R))) (matrix_lmodType (Num.NumField.ringType "
        "R) d r)) G (@GRing.scale (Num.NumField.ringType R) (matrix_lmodType "
        "(Num.NumField.ringType R) d r) c W))) (@proj R d r W G)"
    ),
    "gauge_gradient": (
        "gauge_gradient : forall (R : Num.NumField.type) (d r : nat) (WQ WK : matrix "
        "(Num.NumField.sort R) d r) (H : matrix (Num.NumField.sort R) d d), @eq (matrix "
        "(Num.NumField.sort R) r r) (@skew R r (@GRing.add (matrix_zmodType "
        "(GRing.Ring.zmodType (Num.NumField.ringType R)) r r) (@mulmx (Num.NumField.ringType R)"
        " r d r (@trmx (Num.NumField.sort R) d r WQ) (@mulmx (Num.NumField.ringType R) d d r H "
        "WK)) (@mulmx (Num.NumField.ringType R) r d r (@trmx (Num.NumField.sort R) d r WK) "
        "(@mulmx (Num.NumField.ringType R) d d r (@trmx (Num.NumField.sort R) d d H) WQ)))) "
        "(GRing.zero (matrix_zmodType (Num.NumField.zmodType R) r r))"
    ),
    "gauge_orbit": (
        "gauge_orbit : forall (R : Num.NumField.type) (d r : nat) (WQ WK : matrix "
        "(Num.NumField.sort R) d r) (Q : matrix (Num.NumField.sort R) r r) (_ : @eq (matrix "
        "(GRing.Ring.sort (Num.NumField.ringType R)) r r) (@mulmx (Num.NumField.ringType R) r r"
        " r Q (@trmx (Num.NumField.sort R) r r Q)) (@scalar_mx (Num.NumField.ringType R) r "
        "(GRing.one (Num.NumField.ringType R)))), @eq (matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) d d) (@mulmx (Num.NumField.ringType R) d r d (@mulmx "
        "(Num.NumField.ringType R) d r r WQ Q) (@trmx (GRing.Ring.sort (Num.NumField.ringType "
        "R)) d r (@mulmx (Num.NumField.ringType R) d r r WK Q))) (@mulmx (Num.NumField.ringType"
        " R) d r d WQ (@trmx (Num.NumField.sort R) d r WK))"
    ),
    "complement_orthogonal": (
        "complement_orthogonal : forall (R : Num.NumField.type) (m r k : nat) (U : matrix "
        "(Num.NumField.sort R) m r) (A : matrix (Num.NumField.sort R) m k) (_ : @eq (matrix "
        "(GRing.Ring.sort (Num.NumField.ringType R)) r r) (@mulmx (Num.NumField.ringType R) r m"
        " r (@trmx (Num.NumField.sort R) m r U) U) (@scalar_mx (Num.NumField.ringType R) r "
        "(GRing.one (Num.NumField.ringType R)))), @eq (matrix (GRing.Ring.sort "
        "(Num.NumField.ringType R)) r k) (@mulmx (Num.NumField.ringType R) r m k (@trmx "
        "(Num.NumField.sort R) m r U) (@GRing.add (matrix_zmodType (Num.NumField.zmodType R) m "
        "k) A (@GRing.opp (matrix_zmodType (GRing.Ring.zmodType (Num.NumField.ringType R)) m k)"
        " (@mulmx (Num.NumField.ringType R) m r k U (@mulmx (Num.NumField.ringType R) r m k "
        "(@trmx (Num.NumField.sort R) m r U) A))))) (GRing.zero (matrix_zmodType "
        "(GRing.Ring.zmodType (Num.NumField.ringType R)) r k))"
    ),
}
