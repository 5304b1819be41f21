"""Document-length samplers and histograms, checked against the shared raw histogram data."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.masks.doclens import builtin_histograms, load_histograms, sample_doc_lengths

RAW = Path("/work/shared/data/doc_lengths.json")
HIST_NAMES = ("pile", "prolong64k", "prolong512k")
SOURCES = ("auto", "pile", "prolong64k", "prolong512k", "chatqa", "long", "uniform", "fixed")


def raw_histogram(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(edges, normalised probabilities) read directly from the shared data file."""
    bins = json.loads(RAW.read_text())["histograms"][name]["bins"]
    edges = np.array([bins[0][0]] + [b[1] for b in bins], dtype=np.int64)
    weights = np.array([b[2] for b in bins], dtype=np.float64)
    return edges, weights / weights.sum()


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- basic contract
@settings(max_examples=80, deadline=None)
@given(
    total=st.one_of(st.integers(1, 64), st.integers(1, 300_000)),
    source=st.sampled_from(SOURCES),
    seed=st.integers(0, 2**32 - 1),
)
def test_lengths_are_positive_and_sum_to_total(total: int, source: str, seed: int) -> None:
    kwargs: dict[str, Any] = {"source": source}
    if source == "uniform":
        kwargs |= {"min_doc_len": 7, "max_doc_len": 500}
    if source == "fixed":
        kwargs["doc_len"] = 333
    lengths = sample_doc_lengths(total, rng(seed), **kwargs)
    assert isinstance(lengths, np.ndarray) and np.issubdtype(lengths.dtype, np.integer)
    assert lengths.ndim == 1 and len(lengths) >= 1
    assert int(lengths.sum()) == total
    assert (lengths >= 1).all()
    again = sample_doc_lengths(total, rng(seed), **kwargs)
    assert np.array_equal(lengths, again)  # reproducible from the seed


@pytest.mark.parametrize("source", SOURCES)
def test_total_of_one(source: str) -> None:
    assert sample_doc_lengths(1, rng(0), source=source).tolist() == [1]


@pytest.mark.parametrize("source", ["auto", "pile", "prolong64k", "prolong512k", "long", "uniform"])
def test_different_seeds_give_different_packs(source: str) -> None:
    packs = {tuple(sample_doc_lengths(200_000, rng(seed), source=source)) for seed in range(10)}
    assert len(packs) == 10


@settings(max_examples=40, deadline=None)
@given(total=st.integers(1, 5000), doc_len=st.integers(1, 6000))
def test_fixed_lengths_exact(total: int, doc_len: int) -> None:
    lengths = sample_doc_lengths(total, rng(0), source="fixed", doc_len=doc_len)
    expected = [doc_len] * (total // doc_len) + ([total % doc_len] if total % doc_len else [])
    assert lengths.tolist() == expected


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(1, 20_000),
    lo=st.integers(1, 300),
    extra=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_uniform_lengths_in_range(total: int, lo: int, extra: int, seed: int) -> None:
    hi = lo + extra
    lengths = sample_doc_lengths(total, rng(seed), source="uniform", min_doc_len=lo, max_doc_len=hi)
    assert int(lengths.sum()) == total
    # Every document but the last (cut to fit) is uniform in [lo, hi].
    assert ((lengths[:-1] >= lo) & (lengths[:-1] <= hi)).all()
    assert 1 <= lengths[-1] <= hi


def test_uniform_covers_its_range() -> None:
    # 100k tokens of lengths uniform in [10, 20]: ~6,600 documents, each of the 11 values
    # expected ~600 times; all of them, and nothing else, must appear.
    lengths = sample_doc_lengths(100_000, rng(1), source="uniform", min_doc_len=10, max_doc_len=20)
    assert set(lengths[:-1].tolist()) == set(range(10, 21))
    counts = np.bincount(lengths[:-1], minlength=21)[10:]
    assert counts.min() > 400  # expected ~600, sd ~24


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (200, "pile"),
        (5000, "pile"),
        (12288, "pile"),
        (12289, "prolong64k"),
        (40_000, "prolong64k"),
        (65536, "prolong64k"),
        (65537, "prolong512k"),
        (300_000, "prolong512k"),
    ],
)
def test_auto_picks_histogram_by_total(total: int, expected: str) -> None:
    others = [h for h in HIST_NAMES if h != expected]
    differs = dict.fromkeys(others, False)
    for seed in range(5):
        auto = sample_doc_lengths(total, rng(seed), source="auto")
        assert np.array_equal(auto, sample_doc_lengths(total, rng(seed), source=expected))
        for other in others:
            differs[other] |= not np.array_equal(
                auto, sample_doc_lengths(total, rng(seed), source=other)
            )
    # The comparison can tell the histograms apart at this total (so the test can fail).
    assert all(differs.values()), differs


def test_long_source_all_long() -> None:
    # long_fraction=1 and fixed long length 3000: 100,000 tokens = 33 x 3000 + 1000 (cut).
    lengths = sample_doc_lengths(
        100_000, rng(3), source="long", long_fraction=1.0, long_min_len=3000, long_max_len=3000
    )
    assert sorted(lengths.tolist()) == [1000] + [3000] * 33


def test_long_source_mix_and_shuffle() -> None:
    # 60 % of 100,000 tokens in documents of exactly 3001 tokens -> 19 whole ones (+ one cut);
    # the other 40,000 tokens come from the auto histogram (ProLong512K at this total), where
    # an exact length of 3001 is very unlikely. A few extra hits are tolerated.
    lengths = sample_doc_lengths(
        100_000, rng(4), source="long", long_min_len=3001, long_max_len=3001
    )
    assert int(lengths.sum()) == 100_000
    is_long = lengths == 3001
    assert 19 <= is_long.sum() <= 22
    # Short documents exist, and the long ones are shuffled among them rather than in one run.
    assert (lengths < 3001).sum() >= 5
    positions = np.flatnonzero(is_long)
    assert positions[-1] - positions[0] + 1 > len(positions)


def test_long_source_no_long() -> None:
    lengths = sample_doc_lengths(
        100_000, rng(5), source="long", long_fraction=0.0, long_min_len=3001, long_max_len=3001
    )
    assert int(lengths.sum()) == 100_000
    assert (lengths == 3001).sum() <= 1


def test_long_source_long_lengths_range() -> None:
    lengths = sample_doc_lengths(
        1_000_000, rng(6), source="long", long_min_len=8192, long_max_len=30720
    )
    in_range = (lengths >= 8192) & (lengths <= 30720)
    # >= 60 % of the tokens are in documents of the long range (histogram docs may add some).
    assert lengths[in_range].sum() >= 0.6 * 1_000_000 - 30720


# ----------------------------------------------------------------------------- histograms
@pytest.mark.parametrize("name", HIST_NAMES)
def test_builtin_histograms_encode_the_shared_data(name: str) -> None:
    hist = builtin_histograms()[name]
    edges, probs = raw_histogram(name)
    assert hist.edges.dtype == np.int64
    assert np.array_equal(hist.edges, edges)
    assert len(hist.probs) == len(edges) - 1
    assert math.isclose(float(np.sum(hist.probs)), 1.0, abs_tol=1e-12)
    assert np.allclose(hist.probs, probs, rtol=1e-12, atol=0)


def chi2_upper_quantile(df: int, z: float) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at standard-normal score z."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


@pytest.mark.parametrize("name", HIST_NAMES)
def test_histogram_sampling_matches_shared_bin_frequencies(name: str) -> None:
    """Chi-square goodness of fit of 200,000 draws against the normalised shared weights.

    Every bin has probability >= 0.0015, so expected counts are >= 300 and the chi-square
    approximation is accurate. The threshold is the chi-square quantile at z = 5 (upper tail
    ~3e-7; ~100 for 40 degrees of freedom), so a correct sampler essentially never fails (and
    the seed is fixed anyway). Plausible bugs give statistics in the thousands or more: taking
    bin b's probability for bin b+1 changes neighbouring probabilities by ~0.005-0.03, i.e.
    chi2 ~ 200,000 * sum(delta^2 / p) >> 1000; unnormalised or unsorted weights likewise.
    """
    edges, probs = raw_histogram(name)
    n = 200_000
    draws = builtin_histograms()[name].sample(n, rng(12345))
    assert len(draws) == n
    assert draws.min() >= max(int(edges[0]), 1) and draws.max() < edges[-1]
    bins = np.searchsorted(edges, draws, side="right") - 1
    observed = np.bincount(bins, minlength=len(probs))
    expected = n * probs
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    limit = chi2_upper_quantile(len(probs) - 1, 5.0)
    assert chi2 < limit, f"chi2={chi2:.1f} >= {limit:.1f}"
    # A plain sanity bound as well: no bin frequency off by more than 0.005 (>= 8 sd).
    assert np.abs(observed / n - probs).max() < 0.005


def test_pack_first_document_follows_histogram() -> None:
    """The first document of a pack is one histogram draw, cut to the total.

    Over 5000 seeded packs of 12,288 tokens from the Pile histogram, the empirical CDF of the
    first length, evaluated at every bin edge below the total, must match the exact CDF of
    min(L, total). By the DKW inequality, P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2): with
    n = 5000 and eps = 0.04 that is 2 * exp(-16) ~ 2e-7 (a correct sampler gives ~0.01 here).
    Giving each bin its neighbour's probability deviates by ~0.044, and packing from the
    ProLong64K histogram instead of the Pile one by ~0.16, so both would fail.
    """
    total, n = 12288, 5000
    edges, probs = raw_histogram("pile")
    first = np.array([sample_doc_lengths(total, rng(seed), source="pile")[0] for seed in range(n)])
    assert first.max() <= total and first.min() >= 1
    # Exact CDF of min(L, total) at x = every edge below total: P(L < x).
    low = np.maximum(edges[:-1], 1)
    high = edges[1:]  # exclusive
    checkpoints = [x for x in edges[1:] if x < total] + [total]
    max_dev = 0.0
    for x in checkpoints:
        frac = np.clip((x - low) / (high - low), 0.0, 1.0)  # share of each bin's values below x
        cdf = float(np.dot(probs, frac))
        max_dev = max(max_dev, abs(float(np.mean(first < x)) - cdf))
    assert max_dev < 0.04, max_dev


def write_json(tmp_path: Path, content: Any, name: str = "h.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_bin_draws_exclude_the_upper_edge(tmp_path: Path) -> None:
    """A bin [low, high) draws from max(low, 1) .. high - 1 uniformly, per its probability.

    Bins [0, 3) w=1, [3, 10) w=0, [10, 11) w=1: draws are 1 or 2 (p 1/4 each) or 10 (p 1/2);
    drawing ``high`` would produce 3 or 11, a 0 would come from not clamping the low edge.
    """
    path = write_json(
        tmp_path, {"histograms": {"h": {"edges": [0, 3, 10, 11], "weights": [1, 0, 1]}}}
    )
    hist = load_histograms(path)["h"]
    assert hist.edges.tolist() == [0, 3, 10, 11]
    assert np.allclose(hist.probs, [0.5, 0.0, 0.5])
    draws = hist.sample(40_000, rng(7))
    assert set(draws.tolist()) == {1, 2, 10}
    freq = {v: float(np.mean(draws == v)) for v in (1, 2, 10)}
    # sd of each frequency <= sqrt(0.25 / 40000) = 0.0025; tolerance 0.015 is 6 sd.
    assert abs(freq[1] - 0.25) < 0.015 and abs(freq[2] - 0.25) < 0.015
    assert abs(freq[10] - 0.5) < 0.015
    # Through the pack sampler as well: every whole document has one of those lengths.
    lengths = sample_doc_lengths(5000, rng(8), source="histogram_file", histogram_file=str(path))
    assert int(lengths.sum()) == 5000
    assert set(lengths[:-1].tolist()) <= {1, 2, 10}


def test_histogram_file_bins_format_and_name_choice(tmp_path: Path) -> None:
    two = {
        "histograms": {
            "a": {"bins": [[5, 6, 1.0]]},  # always 5
            "b": {"bins": [[7, 8, 2.0], [8, 9, 0.0]]},  # always 7
        }
    }
    path = write_json(tmp_path, two)
    table = load_histograms(path)
    assert set(table) == {"a", "b"}
    a = sample_doc_lengths(
        50, rng(0), source="histogram_file", histogram_file=str(path), histogram_name="a"
    )
    assert a.tolist() == [5] * 10
    b = sample_doc_lengths(
        50, rng(0), source="histogram_file", histogram_file=str(path), histogram_name="b"
    )
    assert b.tolist() == [7] * 7 + [1]
    with pytest.raises(ValueError, match="histogram_name"):  # two histograms: must choose
        sample_doc_lengths(50, rng(0), source="histogram_file", histogram_file=str(path))
    with pytest.raises(ValueError, match="histogram_name"):
        sample_doc_lengths(
            50, rng(0), source="histogram_file", histogram_file=str(path), histogram_name="c"
        )
    # One histogram: the name is optional.
    one = write_json(tmp_path, {"histograms": {"a": {"bins": [[5, 6, 1.0]]}}}, "one.json")
    assert sample_doc_lengths(
        12, rng(0), source="histogram_file", histogram_file=str(one)
    ).tolist() == [5, 5, 2]


def test_shared_file_loads_like_builtin() -> None:
    shared = load_histograms(RAW)
    for name in HIST_NAMES:
        assert np.array_equal(shared[name].edges, builtin_histograms()[name].edges)
        assert np.allclose(shared[name].probs, builtin_histograms()[name].probs)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        [],
        {"histograms": {}},
        {"other": {"h": {"edges": [0, 1, 2], "weights": [1, 1]}}},
        {"histograms": {"h": {"edges": [0, 1, 2]}}},  # missing weights
        {"histograms": {"h": {"weights": [1, 1]}}},  # missing edges
        {"histograms": {"h": {"edges": [0, 5, 5, 10], "weights": [1, 1, 1]}}},  # not increasing
        {"histograms": {"h": {"edges": [0, 5, 3], "weights": [1, 1]}}},  # decreasing
        {"histograms": {"h": {"edges": [0, 5, 10], "weights": [1, -1]}}},  # negative weight
        {"histograms": {"h": {"edges": [0, 5, 10], "weights": [1]}}},  # length mismatch
        {"histograms": {"h": {"edges": [0, 5, 10], "weights": [1, 1, 1]}}},  # length mismatch
        {"histograms": {"h": {"edges": [0, 5, 10], "weights": [0, 0]}}},  # all zero
        {"histograms": {"h": {"edges": [0, 5, 10], "weights": ["a", 1]}}},  # not numbers
        {"histograms": {"h": {"bins": [[0, 5, 1], [6, 10, 1]]}}},  # bins not contiguous
        {"histograms": {"h": {"bins": [[0, 5]]}}},  # bin without weight
    ],
)
def test_malformed_histogram_file_rejected(tmp_path: Path, content: Any) -> None:
    path = write_json(tmp_path, content)
    with pytest.raises(ValueError):
        load_histograms(path)
    with pytest.raises(ValueError):
        sample_doc_lengths(100, rng(0), source="histogram_file", histogram_file=str(path))


# ----------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("total", "kwargs", "names"),
    [
        (0, {}, "total"),
        (-5, {}, "total"),
        (100, {"source": "zipf"}, "zipf"),
        (100, {"source": "uniform", "min_doc_len": 50, "max_doc_len": 10}, "min_doc_len"),
        (100, {"source": "uniform", "min_doc_len": 0, "max_doc_len": 10}, "min_doc_len"),
        (100, {"source": "fixed", "doc_len": 0}, "doc_len"),
        (100, {"source": "long", "long_fraction": 1.5}, "long_fraction"),
        (100, {"source": "long", "long_min_len": 50, "long_max_len": 10}, "long_min_len"),
        (100, {"source": "histogram_file"}, "histogram_file"),
    ],
)
def test_bad_sampler_arguments(total: int, kwargs: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        sample_doc_lengths(total, rng(0), **kwargs)


# ----------------------------------------------------------------------------- ChatQA and caps
#: The MagiAttention CP benchmark's ChatQA document counts, transcribed from its CSV
#: (inclusive bins [a, b] -> count).
CHATQA_CSV = [
    ((0, 10), 30254), ((11, 50), 391188), ((51, 100), 699596), ((101, 200), 1377757),
    ((201, 500), 3794735), ((501, 1024), 3316785), ((1025, 2048), 2106566),
    ((2049, 4096), 988525), ((4097, 8192), 410002), ((8193, 16384), 173574),
    ((16385, 32768), 115007), ((32769, 65536), 18428), ((65537, 131072), 22513),
    ((131073, 196608), 18284),
]  # fmt: skip


def test_chatqa_histogram_holds_the_benchmark_counts_as_half_open_bins() -> None:
    hist = builtin_histograms()["chatqa"]
    assert hist.edges.tolist() == [a for (a, _), _ in CHATQA_CSV] + [196609]
    counts = np.array([c for _, c in CHATQA_CSV], dtype=np.float64)
    assert np.allclose(hist.probs, counts / counts.sum(), rtol=1e-12, atol=0)


def test_max_doc_fraction_splits_long_documents_into_capped_pieces() -> None:
    # fixed 1000-token documents in 5000 tokens with a 0.1 cap (500): ten 500-token pieces
    lengths = sample_doc_lengths(5000, rng(0), source="fixed", doc_len=1000, max_doc_fraction=0.1)
    assert sorted(lengths.tolist()) == [500] * 10
    # 700-token documents with a 300 cap: each becomes 300 + 300 + 100 (shuffled)
    lengths = sample_doc_lengths(2800, rng(1), source="fixed", doc_len=700, max_doc_fraction=0.11)
    assert sorted(lengths.tolist()) == sorted([308, 308, 84] * 4)


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(1, 400_000),
    fraction=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_capped_chatqa_packs_sum_to_total_and_respect_the_cap(
    total: int, fraction: float, seed: int
) -> None:
    lengths = sample_doc_lengths(total, rng(seed), source="chatqa", max_doc_fraction=fraction)
    assert int(lengths.sum()) == total
    assert lengths.min() >= 1
    assert lengths.max() <= max(1, int(fraction * total))


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_max_doc_fraction_out_of_range_names_the_key(fraction: float) -> None:
    with pytest.raises(ValueError, match="max_doc_fraction"):
        sample_doc_lengths(100, rng(0), source="pile", max_doc_fraction=fraction)
