"""What an implementation of the strategies spends outside its kernels, and how it exchanges.

The replay follows a strategy's schedule; two implementations of one schedule still differ in
the copies around each kernel call (layout changes, padding, merging partial outputs,
accumulating gradients) and in how a ring step's send and receive are issued. The planner
predicts lcab's runner by default (`LCAB`). `LONGCA` describes the code that produced the
published H100 context-parallel figures — LongCA-bench's / MagiAttention's
``exps/dist_attn/baselines`` (``utils_cp.py``, ``ring_attn.py``, ``loongtrain.py``,
``ulysess.py``), as read in ``../shared/reference/longca_bench_code_study.md`` §6 — so that the
comparison with those figures predicts the code that was measured. Every number below is a count
of memory passes read off that code, not a fit.

A *pass* reads or writes every element of a tensor once. Counts are per element of the call's
queries (``q``: tokens × local query heads × head dim) and of its keys (``kv``: tokens × local
KV heads × head dim; the count covers K and V together), split into passes over element-sized
data (bf16) and over accumulator-sized data (fp32), into passes over whole tensors and over
the call's active tokens only, and by how they address memory (`Copies`: plain, gathers,
scatters), which sets their rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lcab.cp.stages import Implementation


@dataclass(frozen=True)
class Passes:
    """Memory passes of one call, each (element-sized, accumulator-sized) per element.

    ``q`` and ``kv`` run over the whole local tensors (zero-fills, merges, accumulations);
    ``active_q`` and ``active_kv`` only over the call's active tokens — query rows with work,
    key columns attended — which is what a copy of a call's valid tokens moves.
    """

    q: tuple[float, float] = (0.0, 0.0)
    kv: tuple[float, float] = (0.0, 0.0)
    active_q: tuple[float, float] = (0.0, 0.0)
    active_kv: tuple[float, float] = (0.0, 0.0)

    def plus(self, other: Passes) -> Passes:
        """These passes and ``other``'s, over the same call."""

        def add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
            return (a[0] + b[0], a[1] + b[1])

        return Passes(
            add(self.q, other.q),
            add(self.kv, other.kv),
            add(self.active_q, other.active_q),
            add(self.active_kv, other.active_kv),
        )

    def bytes(self, elements: Elements, elem: int, acc: int) -> float:
        """Bytes these passes move for a call over ``elements``."""

        def per(passes: tuple[float, float]) -> float:
            return passes[0] * elem + passes[1] * acc

        return (
            elements.q * per(self.q)
            + elements.kv * per(self.kv)
            + elements.active_q * per(self.active_q)
            + elements.active_kv * per(self.active_kv)
        )


@dataclass(frozen=True)
class Elements:
    """Elements of one call's tensors (tokens x local heads x head dim)."""

    q: float
    kv: float
    active_q: float
    active_kv: float


@dataclass(frozen=True)
class Copies:
    """A call's memory passes by how they address memory, each kind at its own rate.

    ``plain``: contiguous reads and writes (zero-fills, merges, adds, layout copies);
    ``gathers``: reads through an index (``torch.gather`` with an expanded index — the
    published code's unpad and its zigzag reorders); ``scatters``: writes through an index
    (``scatter_`` into a zeroed tensor — its pad). A GPU runs gathers and scatters well below a
    plain copy's rate, and scatters slower still (`Hardware.gather_efficiency`,
    `Hardware.scatter_efficiency`, both measured by ``python -m lcab.plan.probe``).
    """

    plain: Passes = Passes()
    gathers: Passes = Passes()
    scatters: Passes = Passes()

    def plus(self, other: Copies) -> Copies:
        """These copies and ``other``'s, over the same call."""
        return Copies(
            self.plain.plus(other.plain),
            self.gathers.plus(other.gathers),
            self.scatters.plus(other.scatters),
        )

    def bytes(self, elements: Elements, elem: int, acc: int) -> CopyBytes:
        """Bytes each kind moves for a call over ``elements``."""
        return CopyBytes(
            self.plain.bytes(elements, elem, acc),
            self.gathers.bytes(elements, elem, acc),
            self.scatters.bytes(elements, elem, acc),
        )


@dataclass(frozen=True)
class CopyBytes:
    """Bytes a call's copies move, by kind (`Copies`)."""

    plain: float = 0.0
    gathers: float = 0.0
    scatters: float = 0.0

    @property
    def total(self) -> float:
        """Every byte moved."""
        return self.plain + self.gathers + self.scatters


@dataclass(frozen=True, kw_only=True)
class Harness(Implementation):
    """One implementation's costs around the schedule a strategy states (`lcab.cp.stages`).

    Where it sends or waits otherwise than lcab's runner is `Implementation`'s part.
    """

    name: str
    p2p_batched: bool = True
    """A ring step posts its send and receive as one group (``batch_isend_irecv``): they run at
    once. Unbatched, PyTorch gives each pair of ranks its own two-rank communicator (when
    ``init_process_group`` gets no ``device_id``, as in the published code), so a ring's send and
    receive still run at once on different communicators — except in a ring of two, where both
    go to the same peer over one communicator, whose operations NCCL runs in order: the block
    crosses the link in two phases, one per direction. (With a ``device_id`` PyTorch reuses the
    group's communicator for every pair; that case is not modelled.)"""
    lists_every_document: bool = False
    """A varlen call's ``cu_seqlens`` lists every document of the mask, those with no work in
    the call as empty sequences (True), or only the sequences with work (False)."""
    causal_halves: bool = False
    """On a mask that attends only the past, a zigzag ring step whose K/V come from an earlier
    ring position uses only the first half of them, and one whose K/V come from a later
    position only the second half of its queries; the code extracts that half
    (``thd_read_half_tensor``: its ``ring_half_<q|kv>_<pass>`` passes) and runs the call and its
    copies over the half tensors (True), or calls with the whole tensors (False)."""
    kernel_gets_active_tokens: bool = False
    """A call hands its kernel only the tokens with work in it, gathered out of the padded layout
    (True), or the whole local tensors (False): a backward kernel's own passes over the tokens it
    is given (its pre- and post-processing) run over those."""
    projection_width: int = 0
    """Width of the input from which the timed backward's Q, K and V projections were made (0:
    no projection in the timed region). Its weight gradients are matrix products outside
    attention that the measured time includes (`projection_costs`)."""
    passes: dict[str, Copies] = field(default_factory=dict, hash=False)
    """Keyed ``<family>_<pass>``: ``ulysses_fwd``, ``allgather_bwd``, ``ring_fwd`` (per ring
    step, also for USP's and LoongTrain's steps), ...; ``ulysses_layout_<pass>``: the layout
    copies around a Ulysses group's all-to-alls, once per pass (Ulysses, USP, LoongTrain);
    ``ring_merge_<pass>`` / ``ring_merge_once_<pass>``: merging the ring steps' partial results
    after the ring, per step / once (`merge_passes`); ``ring_accumulate_<pass>``: a ring step's
    copies after its transfer arrived (`accumulate_passes`); missing: no passes."""

    def call_passes(self, family: str, bwd: bool) -> Copies:
        """The copies around one call of ``family`` (ulysses | allgather | ring)."""
        return self.passes.get(f"{family}_{'bwd' if bwd else 'fwd'}", Copies())

    def passes_of(self, what: str, bwd: bool) -> Copies | None:
        """The copies ``what`` (``ulysses_layout``, ``allgather_once``, ...) in one pass."""
        return self.passes.get(f"{what}_{'bwd' if bwd else 'fwd'}")

    def merge_passes(self, bwd: bool) -> tuple[Copies, Copies] | None:
        """(per ring step, once) copies of merging the steps' partial results after the ring.

        None: the implementation merges within each step (its ``ring_<pass>`` passes).
        """
        pass_ = "bwd" if bwd else "fwd"
        per_step = self.passes.get(f"ring_merge_{pass_}")
        if per_step is None:
            return None
        return per_step, self.passes.get(f"ring_merge_once_{pass_}", Copies())

    def accumulate_passes(self, bwd: bool) -> Copies | None:
        """The copies a ring step makes after waiting for its transfer (None: none wait).

        The published backward adds each step's dK/dV into the accumulator its transfer brings
        (`Stage.finish`), so those passes cannot hide behind the transfer.
        """
        return self.passes.get(f"ring_accumulate_{'bwd' if bwd else 'fwd'}")

    def half_passes(self, half: str, bwd: bool) -> Copies:
        """The extraction of a causal ring step's ``half`` (q | kv; "" for none)."""
        if not half:
            return Copies()
        return self.passes.get(f"ring_half_{half}_{'bwd' if bwd else 'fwd'}", Copies())

    def projection_costs(
        self, tokens: int, heads_q: int, heads_kv: int, head_dim: int, elem: int
    ) -> tuple[float, float]:
        """(matrix-product FLOPs, memory bytes) the projections add to a rank's backward.

        Weight gradients ``xᵀ·dQ``, ``xᵀ·dK``, ``xᵀ·dV`` (no ``dx``: the input needs none),
        added into the earlier repetitions' (read, read, write); bias gradients read dQ, dK, dV.
        """
        if not self.projection_width:
            return 0.0, 0.0
        outputs = (heads_q + 2 * heads_kv) * head_dim
        flops = 2.0 * tokens * self.projection_width * outputs
        traffic = (tokens * outputs + 3 * self.projection_width * outputs) * elem
        return flops, float(traffic)


#: lcab's runner (`lcab.cp.ring_attention`): each ring step merges its partial output into a
#: float32 accumulator by LSE (read the accumulator, read the step's output, write the
#: accumulator); the backward does the same for dQ during the step, and for the travelling dK/dV
#: accumulator once the transfer that brings it has been waited for, after the step's kernel
#: (ring-flash-attn's and InternEvo's order): the accumulator travels in float32 during the next
#: step's compute, and only a window's last hop (home) is waited for at once. Transfers are
#: batched. Kernel inputs are used in place, so a call itself adds no passes.
LCAB = Harness(
    name="lcab",
    passes={
        "ring_fwd": Copies(Passes(q=(1, 2))),
        "ring_bwd": Copies(Passes(q=(1, 2))),
        # after the wait: dK and dV into the accumulator (twice the K-sized passes)
        "ring_accumulate_bwd": Copies(Passes(kv=(2, 4))),
    },
)

#: The published baselines (all bf16). Every call gathers its valid tokens out of the padded layout
#: (``fa_varlen_thd_unpad``, ``torch.gather``: a read and a write of each input) and scatters its
#: outputs back into a zeroed padded tensor (``fa_varlen_thd_pad``: zero-fill, then ``scatter_``:
#: read, write); its ``cu_seqlens`` keep every document, zeroing those without work in the call
#: (``generate_valid_cu_seqlens``). A ring forward keeps every step's padded output and merges them
#: only after its last step (LoongTrain: after its last window) with ``thd_out_correction`` (read
#: out, read step, write out, per step, into a zeroed result), so no transfer hides the merge. Ring
#: backward steps accumulate dQ with ``bwd_dq_update`` and, once they have waited for the transfer
#: that brings the dK/dV accumulator, dK/dV with ``bwd_dkv_update`` (read, read, write) after
#: concatenating dK and dV (``torch.cat``). ``attn_p2p_communicate`` posts ``isend`` and ``irecv``
#: one by one — even ranks send first, odd ranks receive first — not as one group
#: (``init_process_group`` gets no ``device_id``, so each pair of ranks has its own communicator): a
#: ring of two moves its blocks in two phases. The backward sends the dK/dV accumulator together
#: with the next K/V block, overlapped with the step; LoongTrain sends it on its own group after
#: each step, overlapped with the next, but waits for the hop after a window's last step, and passes
#: the window's accumulator to the next window during that window's first step. On a causal mask a
#: ring step extracts the half of q or of K/V it needs (``thd_read_half_tensor``) and calls, pads
#: and merges over that half; each call hands FA3 only its valid tokens. Ring All-Gather runs its
#: two zigzag query halves (``thd_read_half_tensor``) as two calls, each against the keys its half
#: attends out of the whole gathered K/V (reordered after the gather by ``torch.gather``,
#: ``gather_with_reorder_before_attn``), re-gathers K/V in the backward, adds each call's
#: full-length dK/dV into zeroed buffers and reorders them before the reduce-scatter. Ulysses, and
#: USP and LoongTrain around their rings (``usp.py`` / ``loongtrain.py`` call the same
#: ``_varlen_all2all_before_attn`` / ``_after_attn``), copy q, k, v to head-major before the
#: all-to-all and back after (``rearrange(...).contiguous()``), and the output once more after the
#: return all-to-all. The timed backward (``out.backward(dout)`` in ``run_benchmark.py``) also runs
#: back through the ``nn.Linear(1024, heads x d)`` projections that made q, k and v from a random
#: ``x`` that needs no gradient: three weight gradients and their bias sums.
LONGCA = Harness(
    name="longca",
    p2p_batched=False,
    dkv_in_accumulator=False,
    regather_bwd=True,
    home_hop=frozenset({"loongtrain"}),
    lists_every_document=True,
    causal_halves=True,
    kernel_gets_active_tokens=True,
    projection_width=1024,
    allgather_halves=True,
    passes={
        # plain q: zero-fill out 1 | gathers: q 2, k, v 4 | scatters: out 2
        "ring_fwd": Copies(
            Passes(q=(1, 0)), Passes(active_q=(2, 0), active_kv=(4, 0)), Passes(active_q=(2, 0))
        ),
        # after the ring, per step: correction 3 (read out, read the step's, write out) over
        # the step's queries; once: zero-fill the result 1
        "ring_merge_fwd": Copies(Passes(q=(3, 0))),
        "ring_merge_once_fwd": Copies(Passes(q=(1, 0))),
        # plain q: zero-fill dq 1, add dq 3; kv: zero-fill dk, dv 2 | gathers: q, out, dout 6,
        # k, v 4 | scatters: dq 2, dk, dv 4
        "ring_bwd": Copies(
            Passes(q=(4, 0), kv=(2, 0)),
            Passes(active_q=(6, 0), active_kv=(4, 0)),
            Passes(active_q=(2, 0), active_kv=(4, 0)),
        ),
        # once the step's transfer has brought the dK/dV accumulator: cat dk, dv 4, add 6
        "ring_accumulate_bwd": Copies(Passes(kv=(10, 0))),
        # causal ring steps, over the half they extract (read, write): q | q, out, dout | k, v
        "ring_half_q_fwd": Copies(Passes(q=(2, 0))),
        "ring_half_q_bwd": Copies(Passes(q=(6, 0))),
        "ring_half_kv_fwd": Copies(Passes(kv=(4, 0))),
        "ring_half_kv_bwd": Copies(Passes(kv=(4, 0))),
        # per call (one query half): plain q: extract the half 2, zero-fill out 1, collect 2 |
        # gathers: q 2, k, v 4 | scatters: out 2
        "allgather_fwd": Copies(
            Passes(q=(5, 0)), Passes(active_q=(2, 0), active_kv=(4, 0)), Passes(active_q=(2, 0))
        ),
        # once per forward: gathers: the reorder of the gathered k, v 4
        "allgather_once_fwd": Copies(gathers=Passes(kv=(4, 0))),
        # per call: plain q: extract q, dout 4, zero-fill dq 1, collect 2; kv: zero-fill dk, dv
        # 2, add into the full-length dk, dv 6 | gathers: q, out, dout 6, k, v 4 | scatters:
        # dq 2, dk, dv 4
        "allgather_bwd": Copies(
            Passes(q=(7, 0), kv=(8, 0)),
            Passes(active_q=(6, 0), active_kv=(4, 0)),
            Passes(active_q=(2, 0), active_kv=(4, 0)),
        ),
        # once per backward: plain kv: zero dk, dv 2 | gathers: the re-gather's reorder 4, the
        # reorder before the reduce-scatter 4
        "allgather_once_bwd": Copies(Passes(kv=(2, 0)), Passes(kv=(8, 0))),
        # plain q: zero-fill out 1 | gathers: q 2, k, v 4 | scatters: out 2
        "ulysses_fwd": Copies(
            Passes(q=(1, 0)), Passes(active_q=(2, 0), active_kv=(4, 0)), Passes(active_q=(2, 0))
        ),
        # plain q: zero-fill dq 1; kv: zero-fill dk, dv 2 | gathers: q, out, dout 6, k, v 4 |
        # scatters: dq 2, dk, dv 4
        "ulysses_bwd": Copies(
            Passes(q=(1, 0), kv=(2, 0)),
            Passes(active_q=(6, 0), active_kv=(4, 0)),
            Passes(active_q=(2, 0), active_kv=(4, 0)),
        ),
        # around the all-to-alls — q: layout 2 + 2, out layout 2 | kv: layout 8
        "ulysses_layout_fwd": Copies(Passes(q=(6, 0), kv=(8, 0))),
        # dout layout 4, dq layout 4 | kv: layout 8
        "ulysses_layout_bwd": Copies(Passes(q=(8, 0), kv=(8, 0))),
    },
)

HARNESSES: dict[str, Harness] = {h.name: h for h in (LCAB, LONGCA)}
