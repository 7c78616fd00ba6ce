"""Loading a ``ChainOptimizer``'s state dict: torch's load of what ``Guard.check_load`` passed,
then the optimizer's own changes (every state tensor its own, √v in its dtype)."""

from __future__ import annotations

from typing import Any

import torch

from torch_port.optim import sharding
from torch_port.optim.guard.states import LoadPlan


class Loading:
    """The load of ``ChainOptimizer`` (a mixin of ``torch.optim.Optimizer`` after the guard)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict`` of a state dict the guard checked (``check_load``): a
        refused state dict changes nothing. The entries named in ``_OWN_ENTRIES`` keep this
        optimizer's values. √v keeps its documented dtype (at least float32; torch would cast
        it to the parameter's dtype, and in bfloat16 √β2·√v rounds back to √v, so √v would
        stop decaying). The load pre-hooks run first, so that what they return is what is
        checked and loaded, and the post-hooks last, after this optimizer's own changes."""
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        pre, post = (
            self._optimizer_load_state_dict_pre_hooks,
            self._optimizer_load_state_dict_post_hooks,
        )
        self._optimizer_load_state_dict_pre_hooks = type(pre)()
        self._optimizer_load_state_dict_post_hooks = type(post)()
        try:
            self._load(self.check_load(state_dict))
        finally:
            self._optimizer_load_state_dict_pre_hooks = pre
            self._optimizer_load_state_dict_post_hooks = post
        for post_hook in post.values():
            post_hook(self)

    def _load(self, plan: LoadPlan) -> None:
        before = [dict(group) for group in self.param_groups]
        super().load_state_dict(plan.state_dict)
        for group, old in zip(self.param_groups, before, strict=True):
            for k, v in old.items():  # entries the saved groups lack keep this optimizer's values
                group.setdefault(k, v)
        self._own_state_tensors()
        self._unverified = plan.unverified
        self._geometries.forget()  # torch keeps the caller's tensors, which a buffer may be
        self._forget_checks()
        for (gi, pi), value in plan.sqrt_v.items():
            p = self.param_groups[gi]["params"][pi]
            if self.param_groups[gi].get("moment", "frame") == "frame":
                self.state[p]["sqrt_v"] = value.to(
                    p.device, self._sqrt_v_dtype(gi, p.dtype)
                ).clone()

    def _own_state_tensors(self) -> None:
        """After a load: every state tensor a contiguous copy owned by this optimizer. torch
        keeps the loaded tensors themselves (cast only where the dtype or device differs), so
        without the copy a state dict taken from a live optimizer would share its tensors with
        that optimizer, and one tensor saved under two entries (as ``torch.save`` keeps it)
        would be shared between them; the steps write their state in place. Sharded state
        (DTensors) is left to ``torch.distributed.checkpoint``, which loads into it in place.
        A step count is held 0-d, as torch's optimizers hold it, and one saved in half
        precision in float32 (in bfloat16 t + 1 rounds back to t from t = 256, and Adam's
        bias corrections would stop)."""
        for entry in self.state.values():
            for k, v in entry.items():
                if isinstance(v, torch.Tensor) and not sharding.is_sharded(v):
                    entry[k] = v.clone(memory_format=torch.contiguous_format)
                    if k == "step":  # 0-d (one entry was checked), at least float32
                        entry[k] = entry[k].reshape(())
                        if v.dtype.itemsize < 4:  # counts stop at 2/ε there
                            entry[k] = entry[k].to(torch.float32)
