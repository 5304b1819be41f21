"""The ring backward overlaps its dK/dV transfers, on groups of their own, as the peers do.

ring-flash-attn (``ring_flash_attn_backward``: ``d_kv_comm.wait()`` after the next
``_flash_attn_backward``) and InternEvo (``local_dkv_comm.wait()`` after the backward) post a
step's accumulator and wait for it only after the next step's kernel. Here the comm layer is
instrumented on every rank of a gloo world (posts, waits, kernels, in order, with the group of
each post) and the schedule is read back from the log; the results are also checked against
the fp64 reference, so the new order cannot buy its overlap with wrong gradients.
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

CASES = [
    ("ring", {}, 4),
    ("usp", {"ulysses_degree": 2}, 4),
    ("loongtrain", {"ulysses_degree": 1, "window_count": 2}, 4),  # 2 windows of 2
    ("loongtrain", {"ulysses_degree": 1, "window_count": 2}, 6),  # 2 windows of 3
]


def rank_main(rank: int, world: int, rendezvous: str, messages: Any, case: tuple) -> None:
    import torch

    import lcab.cp.ring_attention as ring_attention
    from lcab.cp import STRATEGIES
    from lcab.cp.comm import PendingExchange
    from lcab.distributed.context import DistContext
    from lcab.kernels import Problem, get_kernel
    from lcab.masks import make_mask

    torch.set_num_threads(1)
    log: list[tuple[Any, ...]] = []
    names: dict[int, str] = {}
    post, wait, backward = (
        ring_attention.exchange,
        PendingExchange.wait,
        ring_attention.attend_backward,
    )

    def logged_exchange(send, dst, src, group, op="p2p"):
        pending = post(send, dst, src, group, op)
        names[id(pending)] = op
        log.append(("post", op, id(group)))
        return pending

    def logged_wait(self):
        log.append(("wait", names.get(id(self), "?")))
        return wait(self)

    def logged_backward(step, *args):
        log.append(("kernel", step.source))
        return backward(step, *args)

    ring_attention.exchange = logged_exchange
    PendingExchange.wait = logged_wait
    ring_attention.attend_backward = logged_backward

    name, options, _ = case
    ctx = DistContext.start_local(rank, world, 2, "gloo", rendezvous, 120)
    seqlen, hq, hkv = 96, 4, 2
    mask = make_mask("full", seqlen)  # every step computes
    problem = Problem(seqlen, seqlen, hq, hkv, 4, torch.float64)
    strategy = STRATEGIES.get(name)({**options, "balance": "contiguous"}, 2)
    plan = strategy.plan(mask, problem, world)
    prepared = strategy.build(plan, mask, problem, get_kernel("ranges"), ctx)
    gen = torch.Generator().manual_seed(0)
    x = {
        n: torch.randn(seqlen, h, 4, generator=gen, dtype=torch.float64)
        for n, h in (("q", hq), ("k", hkv), ("v", hkv), ("dout", hq))
    }
    leaves = [prepared.to_native(x[n]).requires_grad_(True) for n in ("q", "k", "v")]
    out, _ = prepared.run(*leaves)
    log.clear()  # the backward's schedule only
    out.backward(prepared.to_native(x["dout"]))
    got = [prepared.from_native(t) for t in (out.detach(), *(leaf.grad for leaf in leaves))]
    errors = None
    if rank == 0:
        ref = [x[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
        ref_out, _ = get_kernel("reference")(*ref, mask)
        ref_out.backward(x["dout"])
        expected = [ref_out.detach(), *(r.grad for r in ref)]
        errors = [
            float((g - e).abs().max() / e.abs().max()) for g, e in zip(got, expected, strict=True)
        ]
    messages.put(("log", rank, log, errors, plan.windows, plan.ring))
    ctx.close()


def run_case(case: tuple, tmp_path: Any) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 120.0

    result = launch(rank_main, case[2], (case,), 120.0, on_message, tmp_path)
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    return sorted(got, key=lambda m: m[1])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[1]}")
def test_dkv_waits_after_the_next_kernel_on_its_own_group(case, tmp_path):
    reports = run_case(case, tmp_path)
    errors = reports[0][3]
    assert max(errors) < 1e-10, errors  # out, dq, dk, dv against fp64
    for _, rank, log, _, windows, ring in reports:
        size = ring // windows
        kernels = [i for i, e in enumerate(log) if e[0] == "kernel"]
        assert len(kernels) == ring  # every step computes (full mask)
        posts = [(i, e) for i, e in enumerate(log) if e[0] == "post"]
        waits = [i for i, e in enumerate(log) if e[0] == "wait"]
        dkv_posts = [i for i, e in posts if e[1].endswith("_dkv")]
        # every accumulator hop is posted: size per window inside it, one per window across
        expected_hops = windows * (size if size > 1 else 0) + (windows if windows > 1 else 0)
        assert len(dkv_posts) == expected_hops
        # each accumulator posted before a later kernel is waited for only after that kernel;
        # the one exception is a window's last inner hop, which brings the window block's
        # accumulator home so that it can go on to the next window (posted right after)
        early = 0
        for at in dkv_posts:
            later_kernels = [k for k in kernels if k > at]
            wait_at = next(w for w in waits if w > at and log[w][1] == log[at][1])
            if later_kernels and wait_at < later_kernels[0]:
                early += 1
                assert "inner" in log[at][1] and log[wait_at + 1][1].endswith("outer_dkv"), (
                    rank,
                    log,
                )
        assert early == (windows - 1 if size > 1 else 0)
        # groups: K/V and dK/dV never share one, inner and outer never share one
        groups: dict[str, set[int]] = {}
        for _, e in posts:
            kind = ("outer" if "outer" in e[1] else "inner") + ("_dkv" if "dkv" in e[1] else "")
            groups.setdefault(kind, set()).add(e[2])
        used = [g for gs in groups.values() for g in gs]
        assert len(used) == len(set(used)) == len(groups), groups
