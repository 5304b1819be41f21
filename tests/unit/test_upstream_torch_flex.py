"""The FlexAttention row (`lcab.kernels.upstream.torch_flex`) held to the installed torch.

Its signature, the differentiable LSE the generic backward from merged statistics relies on
(the autograd op's backward takes ``grad_logsumexp`` and passes it on), and the absence of a
CPU backward — the reason Flex's ring backward cannot run on this machine. (Compiled mode
refuses the same way: ``torch.compile(flex_attention)`` raised the same NotImplementedError
on torch 2.13.0 when tried by hand; compiling is left out of the suite for its time.)
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.nn.attention import flex_attention as flex_module

from lcab.kernels import get_kernel
from lcab.kernels.flex import PreparedFlex
from lcab.kernels.upstream.torch_flex import FLEX_ATTENTION


def test_signature_is_torchs() -> None:
    real = inspect.signature(flex_module.flex_attention).parameters
    assert tuple(real) == FLEX_ATTENTION.params
    defaults = {n: p.default for n, p in real.items() if p.default is not p.empty}
    assert defaults == dict(FLEX_ATTENTION.defaults)
    keyword_only = tuple(n for n, p in real.items() if p.kind is p.KEYWORD_ONLY)
    assert keyword_only == FLEX_ATTENTION.keyword_only


def test_lse_gradient_reaches_the_flex_backward() -> None:
    import sys

    hop = sys.modules["torch._higher_order_ops.flex_attention"]
    backward = hop.FlexAttentionAutogradOp.backward
    params = list(inspect.signature(backward).parameters)
    assert params[:3] == ["ctx", "grad_out", "grad_logsumexp"]
    body = inspect.getsource(backward)
    assert body.count("grad_logsumexp") >= 2  # taken, and handed on to the backward op
    assert FLEX_ATTENTION.lse is not None and FLEX_ATTENTION.lse.differentiable
    assert PreparedFlex.lse_grad and get_kernel("flex").caps.stats_backward


def test_no_flex_backward_on_cpu() -> None:
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))
    mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, 128, 128, device="cpu")
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        out, aux = flex_module.flex_attention(
            q, k, v, block_mask=mask, return_aux=AuxRequest(lse=True)
        )
        (out.sum() + aux.lse.sum()).backward()
