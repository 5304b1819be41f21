"""PyTorch's own attention entry points that lcab calls: varlen attention and SDPA.

Read from torch 2.13.0 (git cf30153c), the files the wheel installs; each row's ``source`` names
the file and lines.

Facts beyond the signatures, with their lines:

* ``varlen_attn`` returns the LSE as **(H_q, T_q)**, float32: its custom op's fake kernel
  (``torch/nn/attention/varlen.py`` L135-173, "logsumexp shape: (num_heads, total_q)") and
  ``meta__flash_attention_forward`` (``torch/_meta_registrations.py`` L6665-6675: (B, H, S)
  without ``cum_seq_q``, (H, total_q) with it) agree. The public docstring's "(T_q, H_q)"
  (L249) is wrong, and an adapter that trusted it raised on every GPU call.
* ``varlen_attn`` treats ``window_size == (-1, 0)`` (a tuple) as ``is_causal`` (L307) and
  passes the window on to ``aten::_flash_attention_forward``; the Python source does not say how
  a causal or windowed sequence aligns when its query and key counts differ.
* Its autograd backward ``_backward(ctx, grad_out, grad_lse, grad_rng)`` (L605-635) never reads
  ``grad_lse``: the LSE is not differentiable, although autograd marks it as requiring grad.
* ``scaled_dot_product_attention``'s documented reference (``torch/nn/functional.py``
  L6341-6380) takes ``torch.softmax`` of the biased scores, which is NaN on a row whose bias is
  all -inf; torch's math backend uses a safe softmax (0 there), and the fused CUDA backends
  document nothing for such rows. ``is_causal`` is top-left aligned (L6468-6470).
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, UpstreamFunction, upstream_function

TORCH = "pytorch/pytorch@v2.13.0 (cf30153c)"
VARLEN_FILE = "torch/nn/attention/varlen.py"
META_FILE = "torch/_meta_registrations.py"
FUNCTIONAL_FILE = "torch/nn/functional.py"
NATIVE_FUNCTIONS = "aten/src/ATen/native/native_functions.yaml (schema as registered)"

VARLEN_LSE = LseFact(layout="ht", empty_rows="undocumented", differentiable=False)
"""(H_q, total_q), natural log, float32; its backward ignores the LSE's gradient."""

VARLEN_ATTN = upstream_function(
    module="torch.nn.attention.varlen",
    name="varlen_attn",
    signature=(
        "query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, "
        "window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, "
        "num_splits=None"
    ),
    returns=("output", "lse"),
    lse=VARLEN_LSE,
    alignment="undocumented for unequal lengths",
    source=f"{TORCH}:{VARLEN_FILE}:L176-326",
    notes="returns output alone unless return_aux=AuxRequest(lse=True); window (-1, 0) = causal",
)
VARLEN_AUX_REQUEST = upstream_function(
    module="torch.nn.attention.varlen",
    name="AuxRequest",
    signature="lse=False",
    source=f"{TORCH}:{VARLEN_FILE}:L35-42",
    notes="a NamedTuple",
)
VARLEN_OP = upstream_function(
    module="torch.ops.torch_attn",
    name="_varlen_attn",
    signature=(
        "query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, "
        "window_size=None, enable_gqa=False, seqused_k=None, block_table=None, num_splits=None"
    ),
    returns=("output", "softmax_lse", "rng_state"),
    lse=VARLEN_LSE,
    source=f"{TORCH}:{VARLEN_FILE}:L45-173",
    notes="custom op behind varlen_attn; calls aten::_flash_attention_forward on CUDA",
)
VARLEN_BACKWARD_OP = upstream_function(
    module="torch.ops.torch_attn",
    name="_varlen_attn_backward",
    signature=(
        "grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, "
        "rng_state, scale=None, window_size=None"
    ),
    returns=("grad_query", "grad_key", "grad_value"),
    lse=VARLEN_LSE,
    source=f"{TORCH}:{VARLEN_FILE}:L507-635",
    notes="takes out and lse as given: what _backward passes (its grad_lse is unused)",
)
FLASH_FORWARD = upstream_function(
    module="torch.ops.aten",
    name="_flash_attention_forward",
    signature=(
        "query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, "
        "return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None, "
        "seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None"
    ),
    returns=("output", "softmax_logsumexp", "rng_state", "unused", "debug_attn_mask"),
    lse=LseFact(layout="bhs", varlen_layout="ht"),
    source=f"{TORCH}:{META_FILE}:L6634-6709 + {NATIVE_FUNCTIONS}",
)
FLASH_BACKWARD = upstream_function(
    module="torch.ops.aten",
    name="_flash_attention_backward",
    signature=(
        "grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, "
        "dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None, "
        "window_size_right=None"
    ),
    returns=("grad_query", "grad_key", "grad_value"),
    lse=LseFact(layout="bhs", varlen_layout="ht"),
    source=f"{TORCH}:{META_FILE}:L6801 + {NATIVE_FUNCTIONS}",
)

SDPA = upstream_function(
    module="torch.nn.functional",
    name="scaled_dot_product_attention",
    signature=(
        "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, "
        "enable_gqa=False"
    ),
    returns=("output",),
    alignment="top-left",
    source=f"{TORCH}:{FUNCTIONAL_FILE}:L6341-6480 (aten::scaled_dot_product_attention schema)",
    notes="no LSE; a row whose bias is all -inf: NaN in the documented reference, 0 from the "
    "math backend's safe softmax, undocumented for the fused CUDA backends",
)
FUSED_SDP_CHOICE = upstream_function(
    module="torch",
    name="_fused_sdp_choice",
    signature=(
        "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, "
        "enable_gqa=False"
    ),
    returns=("backend",),
    source=f"{TORCH}:{NATIVE_FUNCTIONS} (aten::_fused_sdp_choice)",
    notes="an int, SDPBackend's value; on CUDA tensors the CUDA chooser; on meta tensors the "
    "MATH choice, and on fake CUDA tensors too (a CUDA build: MATH on an H100, torch "
    "2.11.0+cu130, where the real tensors chose cuDNN; a CPU-only build raises), so lcab asks "
    "on the call's real tensors",
)
SDPA_FLASH_CPU = upstream_function(
    module="torch.ops.aten",
    name="_scaled_dot_product_flash_attention_for_cpu",
    signature="query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None",
    returns=("output", "logsumexp"),
    lse=LseFact(layout="bhs", empty_rows="0", differentiable=False),
    alignment="top-left",
    source=f"{TORCH}:{NATIVE_FUNCTIONS} (aten::_scaled_dot_product_flash_attention_for_cpu)",
)
SDPA_FLASH_CPU_BACKWARD = upstream_function(
    module="torch.ops.aten",
    name="_scaled_dot_product_flash_attention_for_cpu_backward",
    signature=(
        "grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, "
        "scale=None"
    ),
    returns=("grad_query", "grad_key", "grad_value"),
    lse=LseFact(layout="bhs"),
    source=f"{TORCH}:{NATIVE_FUNCTIONS} (aten::_scaled_dot_product_flash_attention_for_cpu_"
    "backward)",
)

ROWS: tuple[UpstreamFunction, ...] = (
    VARLEN_ATTN,
    VARLEN_AUX_REQUEST,
    VARLEN_OP,
    VARLEN_BACKWARD_OP,
    FLASH_FORWARD,
    FLASH_BACKWARD,
    SDPA,
    FUSED_SDP_CHOICE,
    SDPA_FLASH_CPU,
    SDPA_FLASH_CPU_BACKWARD,
)
"""Every row of this table (what the tests hold to the installed torch)."""
