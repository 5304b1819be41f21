"""The version probe reads an operator's and a custom op's parameters, not ``(*args, **kwargs)``.

``inspect.signature`` of an operator packet or a ``torch.library.custom_op`` is
``(*args, **kwargs)``, so a probe built on it accepted any keyword for the very calls lcab makes
to compiled libraries (FlashMask's ``flashmask_cuda.bwd`` is ``torch.ops.flashmask.bwd``):
a build without one of them passed the probe and failed in the timed call. The probe now reads
the schema (and a custom op's own function), so a missing keyword, an argument lcab does not
pass, and a packet it cannot read are reasons. Real operators, defined in a test namespace.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from lcab.kernels.packages import ApiNeed, PackageProbe, api_reasons


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    library = torch.library.Library("lcab_probe_test", "DEF")
    library.define("bwd(Tensor dout, Tensor q, Tensor? dq=None, float softmax_scale=0.0) -> Tensor")
    library.define("needs_more(Tensor dout, Tensor q, int extra) -> Tensor")
    library.define("only_out.out(Tensor dout) -> Tensor")

    @torch.library.custom_op("lcab_probe_test::wrapped", mutates_args=())
    def wrapped(dout: torch.Tensor, q: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return dout.clone()

    fake = types.ModuleType("lcab_probe_fake")
    fake.ops = types.SimpleNamespace(  # type: ignore[attr-defined]
        bwd=torch.ops.lcab_probe_test.bwd,
        needs_more=torch.ops.lcab_probe_test.needs_more,
        only_out=torch.ops.lcab_probe_test.only_out,
        wrapped=wrapped,
    )
    monkeypatch.setitem(sys.modules, "lcab_probe_fake", fake)
    yield fake
    wrapped._lib._destroy()
    library._destroy()


def reasons(*needs: ApiNeed) -> list[str]:
    probe = PackageProbe(module="lcab_probe_fake", distributions=(), needs=needs)
    return api_reasons(probe, "1.0")


def test_an_operator_without_a_keyword_lcab_passes_is_refused(module) -> None:
    assert reasons(ApiNeed("ops.bwd", ("dq", "softmax_scale"))) == []
    found = reasons(ApiNeed("ops.bwd", ("dq", "startend_row_indices")))
    assert found == ["lcab_probe_fake 1.0 has no startend_row_indices in ops.bwd"]


def test_a_custom_op_is_read_through_the_function_it_wraps(module) -> None:
    assert reasons(ApiNeed("ops.wrapped", ("scale",))) == []
    assert reasons(ApiNeed("ops.wrapped", ("softmax_scale",))) == [
        "lcab_probe_fake 1.0 has no softmax_scale in ops.wrapped"
    ]


def test_a_required_argument_lcab_does_not_pass_is_refused(module) -> None:
    found = reasons(ApiNeed("ops.needs_more", (), positional=2))
    assert found == [
        "lcab_probe_fake 1.0's ops.needs_more requires extra, which lcab's adapter does not pass"
    ]
    assert reasons(ApiNeed("ops.bwd", (), positional=2)) == []  # the rest have defaults


def test_a_packet_it_cannot_read_is_a_reason(module) -> None:
    assert reasons(ApiNeed("ops.only_out", ("dout",))) == [
        "lcab_probe_fake 1.0's ops.only_out has no default overload (overloads: out)"
    ]
