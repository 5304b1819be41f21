"""How lcab reads an installed library's private backward before calling it: never a crash,
never a call that cannot bind.

`lcab.kernels.flash_backward` reads the parameters of a plain function, a
``torch.library.custom_op`` and an operator under ``torch.ops`` (its schema) and compares them
with the upstream row it will call by. Two shapes of operator used to slip through: a packet
with no ``default`` overload made the reading raise, and a schema with keyword-only arguments
(after ``*``) passed the comparison of names and then failed lcab's positional call. Both now
come back as a reason, as every other mismatch does. The operators here are real ones, defined
in a test namespace of torch's dispatcher.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lcab.kernels import flash_backward
from lcab.kernels.upstream.facts import UpstreamFunction

ROW = UpstreamFunction(module="lib", name="bwd", params=("x", "y"), source="test:lib.py:L1")


@pytest.fixture(scope="module")
def ops() -> Iterator[object]:
    library = torch.library.Library("lcab_sig_test", "DEF")
    library.define("only_out.out(Tensor x, int y) -> Tensor")  # no default overload
    library.define("by_keyword(Tensor x, *, int y=0) -> Tensor")
    library.define("positional(Tensor x, int y=0) -> Tensor")
    yield torch.ops.lcab_sig_test
    library._destroy()


def test_a_packet_without_a_default_overload_is_a_reason_not_a_crash(ops) -> None:
    packet = ops.only_out
    assert flash_backward.callable_kind(packet) == "library_op"
    assert flash_backward.parameters(packet) == ()
    reason = flash_backward.mismatch(packet, ROW)
    assert reason == "lib.bwd (library_op) has no default overload (overloads: out)"
    assert not flash_backward.takes(packet, ROW)
    assert flash_backward.parameters(packet.out) == ("x", "y")  # an overload itself is read


def test_keyword_only_arguments_are_refused_where_lcab_calls_by_position(ops) -> None:
    packet = ops.by_keyword
    assert flash_backward.parameters(packet) == ("x", "y")  # the names alone agree
    assert flash_backward.keyword_only(packet) == ("y",)
    reason = flash_backward.mismatch(packet, ROW)
    assert reason is not None and "takes (y) by keyword only, not (none)" in reason
    assert not flash_backward.takes(packet, ROW)
    assert flash_backward.takes(ops.positional, ROW)


def test_keyword_only_parameters_of_functions_and_custom_ops_are_read_too() -> None:
    def function(x, *, y=0):
        return x

    assert flash_backward.keyword_only(function) == ("y",)
    assert not flash_backward.takes(function, ROW)
    by_keyword = UpstreamFunction(
        module="lib", name="bwd", params=("x", "y"), keyword_only=("y",), source="test:lib.py"
    )
    assert flash_backward.takes(function, by_keyword)


def test_a_positional_call_of_a_keyword_only_row_is_refused_before_the_call() -> None:
    by_keyword = UpstreamFunction(
        module="lib", name="bwd", params=("x", "y"), keyword_only=("y",), source="test:lib.py"
    )
    with pytest.raises(TypeError, match="takes y by keyword only"):
        flash_backward.positional(by_keyword, {"x": 1, "y": 2})
    assert flash_backward.positional(ROW, {"x": 1, "y": 2}) == [1, 2]
