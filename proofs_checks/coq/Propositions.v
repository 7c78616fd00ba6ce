(* The algebra behind rattn's propositions, for every size d >= r and over any numFieldType
   (a field of characteristic 0 with an order-compatible norm, the rationals and the reals
   among them; ^T is the plain transpose, so over the complex numbers these are statements
   about the bilinear form tr(A^T B), not the Hermitian one). Points and tangent vectors are d x r matrices; the metric is the
   embedded one, <A, B> = tr(A^T B). Checked by proofs_checks.machine_checked, which compiles this
   file with coqc and asks Coq for the assumptions of each lemma: a lemma passes only when it is
   closed under the global context (no axiom, no admission). *)

From mathcomp Require Import all_ssreflect all_algebra.
Set Implicit Arguments.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

Section Stiefel.
Variable R : numFieldType.
Variables d r : nat.

(* sym A = (A + A^T)/2; P_W(Z) = Z - W sym(W^T Z), the Stiefel projection; X is tangent at W
   when W^T X + X^T W = 0. *)
Definition sym (A : 'M[R]_r) : 'M[R]_r := 2^-1 *: (A + A^T).
Definition proj (W Z : 'M[R]_(d, r)) : 'M[R]_(d, r) := Z - W *m sym (W^T *m Z).
Definition tangent (W X : 'M[R]_(d, r)) : Prop := W^T *m X + X^T *m W = 0.

Lemma sym_tr A : (sym A)^T = sym A.
Proof. by rewrite /sym linearZ /= linearD /= trmxK addrC. Qed.

Lemma half_twice : (2^-1 + 2^-1 : R) = 1.
Proof. by rewrite [RHS](splitr 1) mul1r. Qed.

Lemma sym_twice A : sym A + sym A = A + A^T.
Proof. by rewrite /sym -scalerDl half_twice scale1r. Qed.

Lemma sym_tangent W X : tangent W X -> sym (W^T *m X) = 0.
Proof.
by rewrite /tangent /sym trmx_mul trmxK => ->; rewrite scaler0.
Qed.

Lemma proj_tangent W X : tangent W X -> proj W X = X.
Proof. by move=> /sym_tangent; rewrite /proj => ->; rewrite mulmx0 subr0. Qed.

(* GEO-stiefel: P_W(Z) is tangent, P_W is idempotent and self-adjoint. *)
Lemma tangent_proj W Z : W^T *m W = 1%:M -> tangent W (proj W Z).
Proof.
move=> WW; rewrite /tangent /proj.
rewrite mulmxBr mulmxA WW mul1mx linearB /= mulmxBl trmx_mul.
rewrite -mulmxA WW mulmx1 sym_tr addrACA -opprD sym_twice.
by rewrite trmx_mul trmxK subrr.
Qed.

(* Idempotent: P_W(P_W(Z)) = P_W(Z). *)
Lemma proj_idem W Z : W^T *m W = 1%:M -> proj W (proj W Z) = proj W Z.
Proof. by move=> WW; rewrite proj_tangent //; apply: tangent_proj. Qed.

Lemma symD A B : sym (A + B) = sym A + sym B.
Proof. by rewrite /sym [(A + B)^T]linearD /= addrACA -scalerDr. Qed.

Lemma symZ (c : R) A : sym (c *: A) = c *: sym A.
Proof. by rewrite /sym [(c *: A)^T]linearZ /= -scalerDr scalerA mulrC -scalerA. Qed.

Lemma sym1 : sym 1%:M = 1%:M.
Proof. by rewrite /sym trmx1 scalerDr -scalerDl half_twice scale1r. Qed.

(* RA-5: the Riemannian gradient of weight decay vanishes, P_W(W) = 0. *)
Lemma proj_self W : W^T *m W = 1%:M -> proj W W = 0.
Proof.
by move=> WW; rewrite /proj WW sym1 mulmx1 subrr.
Qed.

(* RA-5, coupled decay: adding c W to the gradient leaves its projection unchanged. *)
Lemma coupled_decay W G (c : R) : W^T *m W = 1%:M -> proj W (G + c *: W) = proj W G.
Proof.
move=> WW; rewrite /proj mulmxDr -[W^T *m (c *: W)]scalemxAr WW symD symZ sym1.
by rewrite mulmxDr -[W *m (c *: 1%:M)]scalemxAr mulmx1 opprD addrACA subrr addr0.
Qed.

(* RA-3: (W + X)^T (W + X) = I + X^T X for a tangent X. *)
Lemma gram_step W X : W^T *m W = 1%:M -> tangent W X ->
  (W + X)^T *m (W + X) = 1%:M + X^T *m X.
Proof.
move=> WW TX; rewrite [(W + X)^T]linearD /= mulmxDl !mulmxDr WW.
by rewrite -addrA (addrA (W^T *m X)) TX add0r.
Qed.

(* tr(sym A B) = tr(A^T sym B): the symmetric part moves across the trace. *)
Lemma trace_sym_swap (A B : 'M[R]_r) : \tr (sym A *m B) = \tr (A^T *m sym B).
Proof.
rewrite /sym -scalemxAl -scalemxAr !mxtraceZ; congr (_ * _).
rewrite mulmxDl mulmxDr !mxtraceD addrC; congr (_ + _).
by rewrite -trmx_mul mxtrace_tr mxtrace_mulC.
Qed.

(* P_W is self-adjoint in the embedded metric <A, B> = tr(A^T B). *)
Lemma proj_adjoint W Z Y : \tr ((proj W Z)^T *m Y) = \tr (Z^T *m proj W Y).
Proof.
rewrite /proj [(Z - _)^T]linearB /= mulmxBl mulmxBr !raddfB /=; congr (_ - _).
rewrite trmx_mul sym_tr -mulmxA trace_sym_swap trmx_mul trmxK.
by rewrite mulmxA.
Qed.

(* RA-1: on the tangent space, <G, X> = <P_W(G), X>. *)
Lemma steepest W G X : tangent W X -> \tr (G^T *m X) = \tr ((proj W G)^T *m X).
Proof. by move=> TX; rewrite proj_adjoint proj_tangent. Qed.

End Stiefel.

Section Gauge.
Variable R : numFieldType.
Variables d r : nat.

Definition skew (A : 'M[R]_r) : 'M[R]_r := 2^-1 *: (A - A^T).

(* RA-6: a loss of W_Q W_K^T has factor gradients (H W_K, H^T W_Q), H its gradient in
   W_Q W_K^T, and they are orthogonal to every vertical direction:
   skew(W_Q^T G_Q + W_K^T G_K) = 0. *)
Lemma gauge_gradient (WQ WK : 'M[R]_(d, r)) (H : 'M[R]_d) :
  skew (WQ^T *m (H *m WK) + WK^T *m (H^T *m WQ)) = 0.
Proof.
have -> : WK^T *m (H^T *m WQ) = (WQ^T *m (H *m WK))^T.
  by rewrite !trmx_mul trmxK mulmxA.
by rewrite /skew [(_ + _)^T]linearD /= trmxK (addrC (_^T)) subrr scaler0.
Qed.

(* ... and the loss is constant along the gauge orbit: (W_Q Q)(W_K Q)^T = W_Q W_K^T. *)
Lemma gauge_orbit (WQ WK : 'M[R]_(d, r)) (Q : 'M[R]_r) :
  Q *m Q^T = 1%:M -> (WQ *m Q) *m (WK *m Q)^T = WQ *m WK^T.
Proof. by move=> QQ; rewrite trmx_mul mulmxA -(mulmxA WQ) QQ mulmx1. Qed.

End Gauge.

Section Complement.
Variable R : numFieldType.
Variables m r k : nat.

(* R1, P1: the projected factor (I - U U^T) A of a tangent vector is orthogonal to U. *)
Lemma complement_orthogonal (U : 'M[R]_(m, r)) (A : 'M[R]_(m, k)) :
  U^T *m U = 1%:M -> U^T *m (A - U *m (U^T *m A)) = 0.
Proof. by move=> UU; rewrite mulmxBr mulmxA UU mul1mx subrr. Qed.

End Complement.
