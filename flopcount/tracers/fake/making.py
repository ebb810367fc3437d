"""FakeTensors made from metadata, several times cheaper than ``FakeTensor(mode, meta, device)``.

The default path makes a fresh fake for every parameter it reads (on first use) and for every
op result the shape cache or structural reuse answers: ~300 per ResNet-50 count. torch's
constructor spends ~17 us on each (argument checks, device normalisation, eleven memo
descriptors written one by one); the tensor itself (``Tensor._make_subclass`` of a meta
tensor, with the fake's device for the backend keys) costs ~3 us. :class:`FakeMaker` makes the
tensor that way and gives it the Python state a constructor-made fake of the same mode and
device holds (one made per device, its ``__dict__`` copied, as a split table: ~130 B less per fake): the same object in every respect
torch looks at, checked once per maker against a constructor-made fake (type, device, the
state, the data-pointer guard). Should torch's constructor change what it sets, the check fails
and every fake is made by the constructor, as before.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Sequence

import torch

__all__ = ["FakeMaker"]

_META = torch.device("meta")


class FakeMaker:
    """Fakes of ``mode`` (a FakeTensorMode) made from shape, stride, dtype and device."""

    __slots__ = ("_mode", "_type", "_states", "_fast")

    def __init__(self, mode: Any, fake_type: Any):
        self._mode = mode
        self._type = fake_type
        # the fake device -> the Python state of a constructor-made fake on it
        self._states: Dict[torch.device, Dict[str, Any]] = {}
        self._fast: Optional[bool] = None  # None: not checked yet

    def make(
        self,
        shape: Sequence[int],
        stride: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool = False,
        is_param: bool = False,
    ) -> Any:
        """A fake of that metadata (offset 0), with a gradient and a parameter's flag when
        asked. Call it below the fake mode's dispatch (``torch._C._DisableTorchDispatch``)."""
        return self.wrap(torch.empty_strided(shape, stride, dtype=dtype, device=_META), device, requires_grad, is_param)

    def wrap(self, meta: torch.Tensor, device: torch.device, requires_grad: bool = False, is_param: bool = False) -> Any:
        """``meta`` (a meta tensor: its storage is shared) as a fake on ``device``."""
        state = self._states.get(device)
        if state is None or not self._fast:
            return self._slow(meta, device, requires_grad, is_param)
        made = torch.Tensor._make_subclass(self._type, meta, requires_grad, dispatch_device=True, device_for_backend_keys=device)
        made.__dict__ = state.copy()  # a copy of a split table is one (see _split)
        if is_param:
            made._is_param = True
        return made

    def _slow(self, meta: torch.Tensor, device: torch.device, requires_grad: bool, is_param: bool) -> Any:
        # the constructor's oldest signature (torch 2.11's takes no requires_grad/_is_param): the flags
        # set as FakeTensorMode.from_tensor sets them, after it
        made = self._type(self._mode, meta, device)
        if requires_grad:
            made.requires_grad_(True)
        if is_param:
            made._is_param = True
        if device not in self._states:
            state = self._split({k: v for k, v in vars(made).items() if k != "_is_param"}, device)
            self._states[device] = state
            if self._fast is None:
                self._fast = self._check(state, device)
        return made

    def _split(self, state: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
        """``state`` as the ``__dict__`` of a blank fake filled one attribute at a time: CPython
        then makes it a split table (its keys shared with the class's other instances), and a copy
        of a split table is one too: each fake's ``__dict__`` ~300 B instead of ~460 B (issue #32's
        memory: a deep model's count holds two fakes per layer, its KV cache's). Where it is not
        (another interpreter), the copy is a plain dictionary of the same items."""
        try:
            blank = torch.Tensor._make_subclass(
                self._type, torch.empty(0, device=_META), False, dispatch_device=True, device_for_backend_keys=device
            )
            for name, value in state.items():
                object.__setattr__(blank, name, value)
            made = vars(blank)
            return made if list(made) == list(state) and all(made[k] is v for k, v in state.items()) else state
        except Exception:  # a changed torch: the state as read, which the check below compares
            return state

    def _check(self, state: Dict[str, Any], device: torch.device) -> bool:
        """Whether a fake made the fast way equals one made by the constructor in type, device,
        metadata, Python state and whether a read of its data pointer raises (a changed torch: False, the constructor
        every time; so too under torch's fake-tensor debug mode, whose per-fake traceback differs)."""
        try:
            shape, stride, dtype = (2, 3), (3, 1), torch.float32
            slow = self._type(self._mode, torch.empty_strided(shape, stride, dtype=dtype, device=_META), device)
            meta = torch.empty_strided(shape, stride, dtype=dtype, device=_META)
            fast = torch.Tensor._make_subclass(self._type, meta, False, dispatch_device=True, device_for_backend_keys=device)
            fast.__dict__ = state.copy()
            same_state = set(vars(slow)) == set(state) and all(
                vars(slow)[k] is v or vars(slow)[k] == v for k, v in state.items()
            )
            return bool(
                same_state
                and type(fast) is type(slow)
                and fast.device == slow.device
                and fast.fake_mode is slow.fake_mode
                and fast.shape == slow.shape
                and fast.stride() == slow.stride()
                and fast.dtype == slow.dtype
                and fast.requires_grad == slow.requires_grad
                and _data_pointer(fast) == _data_pointer(slow)
            )
        except Exception:
            return False


def _data_pointer(tensor: torch.Tensor) -> str:
    """Whether reading a fake's data pointer raises: the error's type, or "". A constructor-made
    fake of a mode that allows unsafe access (FakeTensorMode's default) warns once per process
    and reads 0, as ours reads 0; torch's config can make the constructor's fakes raise instead,
    ours would not: the check then fails and the constructor makes every fake."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tensor.untyped_storage().data_ptr()
        except Exception as exc:
            return type(exc).__name__
    return ""
