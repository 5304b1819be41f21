"""FlexAttention (torch 2.13): the public call lcab makes and the fact its backward rests on.

Read from the installed torch 2.13.0 (``torch/nn/attention/flex_attention.py`` and
``torch/_higher_order_ops/flex_attention.py``):

* ``flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
  kernel_options, *, return_aux)``; with ``return_aux=AuxRequest(lse=True)`` it returns
  ``(out, AuxOutput)`` whose ``lse`` is (B, Hq, Sq), natural log;
* the LSE is differentiable (since torch 2.5, PR #133159): ``FlexAttentionAutogradOp.backward``
  (L814-880) takes ``grad_logsumexp`` and hands it to ``flex_attention_backward``, whose dense
  reference adds it to the score gradient (L1041-1077). So the generic backward from merged
  statistics (autograd through out *and* lse, `PreparedAttention.backward`) is exact for Flex;
* no backward on CPU: ``FlexAttentionAutogradOp`` raises "FlexAttention does not support
  backward on CPU" in eager and compiled mode alike (checked in the test).
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

SOURCE = "pytorch/pytorch@v2.13.0 (the installed wheel)"

FLEX_LSE = LseFact(layout="bhs", empty_rows="-inf", differentiable=True, dtype="float32")

FLEX_ATTENTION = upstream_function(
    module="torch.nn.attention.flex_attention",
    name="flex_attention",
    signature=(
        "query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, "
        "return_lse=False, kernel_options=None, *, return_aux=None"
    ),
    returns=("out", "aux"),
    lse=FLEX_LSE,
    alignment="n/a (the BlockMask / mask_mod states every pair)",
    source=f"{SOURCE}:torch/nn/attention/flex_attention.py",
    notes="aux.lse with return_aux=AuxRequest(lse=True)",
)
