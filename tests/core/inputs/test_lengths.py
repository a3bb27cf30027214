"""Length sources (core/lengths.py): lists, files, traces and seeded distributions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.errors import ParameterError
from kvcalc.core.inputs.lengths import (
    LengthDistribution,
    lengths_from_trace,
    load_lengths,
    parse_lengths_list,
    read_lengths_file,
    sample_lengths,
    worked_example,
)

N_SAMPLES = 200_000


def _assert_mean_close(sample: np.ndarray, mean: float, sd: float) -> None:
    """The sample mean lies within 5 standard errors (sd / sqrt(n)) of the exact mean: fails ~1 in 1.7 million."""
    tolerance = 5 * sd / math.sqrt(sample.size)
    assert abs(sample.mean() - mean) < tolerance, (sample.mean(), mean, tolerance)


# --- given lists and files -----------------------------------------------------------------------------


def test_worked_example_is_constructed():
    example = worked_example()
    assert example.tokens.tolist() == [37, 91, 128, 201, 511]
    assert (example.count, example.total, example.min, example.max) == (5, 968, 37, 511)
    assert example.kind == "constructed" and example.description.startswith("constructed: ")


def test_parse_list():
    lengths = parse_lengths_list(" 37, 91 ,128")
    assert lengths.tokens.tolist() == [37, 91, 128] and lengths.tokens.dtype == np.int64
    assert lengths.kind == "user" and float(lengths.mean) == pytest.approx((37 + 91 + 128) / 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("37,0,5", r"^lengths item 2: length 0 is not positive"),
        ("37,-4", r"^lengths item 2: length -4 is not positive"),
        ("37,91.5", r"^lengths item 2: '91.5' is not an integer"),
        ("37,abc,1", r"^lengths item 2: 'abc' is not an integer"),
        ("37,,1", r"has an empty item"),
        ("1,99999999999999999999", r"item 2: length 99999999999999999999 is too large"),
        ("1,4611686018427387905", r"item 2: length 4611686018427387905 is too large"),  # 2^62 + 1 fits int64
    ],
)
def test_parse_list_bad_items(text, message):
    with pytest.raises(ValueError, match=message):
        parse_lengths_list(text)


def test_lines_file_skips_blank_lines(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("37\n\n91\n 128 \n")
    lengths = read_lengths_file(path)
    assert lengths.tokens.tolist() == [37, 91, 128]
    assert lengths.kind == "user" and str(path) in lengths.source


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("37\n91\nabc\n", r"lengths.txt:3: 'abc' is not an integer"),
        ("37\n\n4.5\n", r"lengths.txt:3: '4.5' is not an integer"),
        ("37\n0\n", r"lengths.txt:2: length 0 is not positive"),
        ("37\n-2\n", r"lengths.txt:2: length -2 is not positive"),
        ("", r"is empty"),
        ("\n \n", r"is empty"),
        ("a,b\n1,2\n", r"for a CSV give column NAME"),
    ],
)
def test_lines_file_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_lengths_file(path)


def test_csv_column(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("id,prompt,output\n1,37,5\n2,91,7\n\n3,128,1\n")
    lengths = read_lengths_file(path, column="prompt")
    assert lengths.tokens.tolist() == [37, 91, 128]
    assert "column prompt" in lengths.source


def test_csv_errors(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("id,prompt\n1,37\n2,x\n")
    with pytest.raises(ValueError, match=r"no column 'tokens': its columns are id, prompt"):
        read_lengths_file(path, column="tokens")
    with pytest.raises(ValueError, match=r"requests.csv:3 \(column prompt\): 'x' is not an integer"):
        read_lengths_file(path, column="prompt")
    path.write_text("id,prompt\n")
    with pytest.raises(ValueError, match="header but no rows"):
        read_lengths_file(path, column="prompt")
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        read_lengths_file(path, column="prompt")


def test_json_list(tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps([37, 91, 128]))
    assert read_lengths_file(path).tokens.tolist() == [37, 91, 128]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[37, 9.5]", r"item 2: 9.5 is not an integer"),
        ("[37, true]", r"item 2: True is not an integer"),
        ("[37, 0]", r"item 2: length 0 is not positive"),
        ("[]", "empty list"),
        ('{"a": 1}', "not a list"),
        ("[37,", "not valid JSON"),
    ],
)
def test_json_errors(tmp_path, content, message):
    path = tmp_path / "lengths.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_lengths_file(path)


def test_npy(tmp_path):
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([37, 91, 128], dtype=np.int32))
    assert read_lengths_file(path).tokens.tolist() == [37, 91, 128]
    np.save(path, np.array([37, 91], dtype=np.uint16))
    assert read_lengths_file(path).tokens.tolist() == [37, 91]


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.array([37.0, 91.5]), r"float64 values are not integer lengths; save an integer array"),
        (np.array([[1, 2], [3, 4]]), r"shape \(2, 2\)"),
        (np.array([5, 0, 3]), r"item 2: length 0 is not positive"),
        (np.array([], dtype=np.int64), "holds no lengths"),
        (np.array(["a"]), "<U1 values are not integer lengths"),
    ],
)
def test_npy_errors(tmp_path, array, message):
    path = tmp_path / "lengths.npy"
    np.save(path, array)
    with pytest.raises(ValueError, match=message):
        read_lengths_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_lengths_file(tmp_path / "nope.txt")


# --- real traces ---------------------------------------------------------------------------------------


def test_azure_trace_total_and_prompt(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    total = lengths_from_trace("azure", path)
    assert total.tokens.tolist() == [374 + 44, 396 + 109]
    assert total.kind == "real" and total.description.startswith("real: azure trace")
    assert "ContextTokens + GeneratedTokens" in total.source
    prompt = lengths_from_trace("azure", path, phase="prompt")
    assert prompt.tokens.tolist() == [374, 396] and "prompt only" in prompt.source


def test_mooncake_trace(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    records = [
        {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 7322, "output_length": 490, "hash_ids": [0, 2]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert lengths_from_trace("mooncake", path).tokens.tolist() == [6758 + 500, 7322 + 490]
    assert lengths_from_trace("mooncake", path, "prompt").tokens.tolist() == [6758, 7322]


def test_trace_with_an_empty_prompt_names_the_request(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n2023-11-16 18:15:47,0,3\n")
    assert lengths_from_trace("azure", path).tokens.tolist() == [6, 3]
    with pytest.raises(ValueError, match=r"request 2 \(file order\): length 0 \(prompt only\)"):
        lengths_from_trace("azure", path, "prompt")


def test_trace_bad_phase(tmp_path):
    with pytest.raises(ValueError, match="unknown phase 'output'"):
        lengths_from_trace("azure", tmp_path / "x.csv", "output")


@pytest.mark.parametrize("phase", ["", " "])
def test_an_empty_phase_is_refused_not_read_as_the_default(tmp_path, phase):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n")
    with pytest.raises(ValueError, match="unknown phase '': choose total"):
        load_lengths(trace=("azure", path), phase=phase)


# --- distributions -------------------------------------------------------------------------------------


def test_parse_describe_round_trip():
    dist = LengthDistribution.parse(" LogNormal : mean=161 , sigma=1.0 ")
    assert dist.name == "lognormal" and dist.param("mean") == 161 and dist.param("sigma") == 1.0
    assert dist.describe() == "lognormal(mean=161, sigma=1)"
    assert LengthDistribution.parse(dist.spec) == dist
    assert LengthDistribution.parse("uniform:high=9").describe() == "uniform(low=1, high=9)"  # low defaults to 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gamma:mean=3", "unknown distribution 'gamma'"),
        ("lognormal", "exactly one of mean or median"),
        ("lognormal:mean=5,median=5", "exactly one of mean or median"),
        ("lognormal:mean=5,scale=2", "unknown parameter 'scale=2' for lognormal"),
        ("lognormal:mean", "unknown parameter 'mean' for lognormal"),
        ("lognormal:mean=abc", "mean='abc' is not a number"),
        ("lognormal:mean=nan", "must be finite"),
        ("lognormal:mean=-3", "mean=-3 is out of range"),
        ("lognormal:mean=100,sigma=0", "sigma=0 is out of range"),
        ("uniform:low=5,high=2", "high=2 is out of range"),
        ("uniform:low=0,high=2", "low=0 is out of range"),
        ("uniform:high=2.5", "high='2.5' is not an integer"),
        ("exponential", "exponential needs mean"),
        ("exponential:mean=0.5", "mean=0.5 is out of range"),
        ("zipf:a=1.2", "zipf needs max"),
        ("zipf:a=1,max=100", "a=1 is out of range"),
        ("zipf:a=2,max=100000000", "max=100000000 is out of range"),
    ],
)
def test_parse_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        LengthDistribution.parse(spec)


@pytest.mark.parametrize(
    "spec", ["lognormal:mean=161,sigma=1.0", "uniform:low=3,high=9", "exponential:mean=50", "zipf:a=1.5,max=64"]
)
def test_seeded_samples_are_reproducible_int64_and_positive(spec):
    dist = LengthDistribution.parse(spec)
    first = dist.sample(1000, np.random.default_rng(7))
    assert first.dtype == np.int64 and first.shape == (1000,) and first.min() >= 1
    assert np.array_equal(first, dist.sample(1000, np.random.default_rng(7)))
    assert not np.array_equal(first, dist.sample(1000, np.random.default_rng(8)))
    lengths = sample_lengths(dist, 1000, seed=7)
    assert np.array_equal(lengths.tokens, first)
    assert lengths.kind == "constructed" and "seed 7" in lengths.source and dist.describe() in lengths.source


def test_uniform_mean_and_bounds():
    sample = LengthDistribution.parse("uniform:low=3,high=9").sample(N_SAMPLES, np.random.default_rng(1))
    assert sample.min() == 3 and sample.max() == 9  # both ends inclusive (and reached at this size)
    # discrete uniform on 3..9: mean 6, variance ((9 − 3 + 1)^2 − 1) / 12 = 4
    _assert_mean_close(sample, 6.0, 2.0)


def test_exponential_is_geometric_with_the_given_mean():
    sample = LengthDistribution.parse("exponential:mean=50").sample(N_SAMPLES, np.random.default_rng(2))
    p = 1 / 50  # geometric on 1, 2, …: mean 1/p = 50, variance (1 − p) / p^2 = 2450
    assert sample.min() >= 1
    _assert_mean_close(sample, 50.0, math.sqrt((1 - p) / p**2))


def test_exponential_truncated_by_resampling():
    sample = LengthDistribution.parse("exponential:mean=50,max=60").sample(N_SAMPLES, np.random.default_rng(3))
    assert sample.min() >= 1 and sample.max() == 60
    p = 1 / 50  # the geometric conditioned on k <= 60: exact mean and sd from the pmf
    pmf = np.array([(1 - p) ** (k - 1) * p for k in range(1, 61)])
    pmf /= pmf.sum()
    support = np.arange(1, 61)
    mean = float((support * pmf).sum())
    _assert_mean_close(sample, mean, math.sqrt(float((support**2 * pmf).sum()) - mean**2))


def test_lognormal_mean_of_ceiled_lengths():
    mean_x, sigma = 100.0, 0.5
    mu = math.log(mean_x) - sigma**2 / 2
    sample = LengthDistribution.parse(f"lognormal:mean={mean_x},sigma={sigma}").sample(
        N_SAMPLES, np.random.default_rng(4)
    )
    # E[ceil X] = Σ_{k >= 0} P(X > k), with P(X > k) = erfc((ln k − mu) / (sigma √2)) / 2 for k >= 1
    expected = 1 + sum(0.5 * math.erfc((math.log(k) - mu) / (sigma * math.sqrt(2))) for k in range(1, 20_000))
    assert mean_x < expected < mean_x + 1  # ceil adds less than one token on average
    sd_x = mean_x * math.sqrt(math.exp(sigma**2) - 1)  # sd of the lognormal; ceil adds at most 0.5 to it
    _assert_mean_close(sample, expected, sd_x + 0.5)


def test_lognormal_by_median():
    sample = LengthDistribution.parse("lognormal:median=200,sigma=0.7").sample(N_SAMPLES, np.random.default_rng(5))
    assert np.median(sample) == pytest.approx(200, rel=0.02)  # ceil keeps the median at 200 (an integer)


def test_lognormal_truncated_by_max():
    sample = LengthDistribution.parse("lognormal:mean=1000,sigma=1.5,max=2000").sample(
        50_000, np.random.default_rng(6)
    )
    assert sample.min() >= 1 and sample.max() <= 2000


def test_zipf_exact_mean_and_bounds():
    a, upper = 1.5, 1000
    sample = LengthDistribution.parse(f"zipf:a={a},max={upper}").sample(N_SAMPLES, np.random.default_rng(9))
    assert sample.min() == 1 and sample.max() <= upper
    # P(k) = k^-a / H, H = Σ_{k=1}^{max} k^-a
    weights = [k**-a for k in range(1, upper + 1)]
    norm = sum(weights)
    mean = sum(k * w for k, w in zip(range(1, upper + 1), weights, strict=True)) / norm
    second = sum(k * k * w for k, w in zip(range(1, upper + 1), weights, strict=True)) / norm
    _assert_mean_close(sample, mean, math.sqrt(second - mean**2))
    assert abs((sample == 1).mean() - 1 / norm) < 5 * math.sqrt((1 / norm) * (1 - 1 / norm) / N_SAMPLES)


@pytest.mark.parametrize("count", [0, -5])
def test_count_must_be_positive(count):
    with pytest.raises(ValueError, match=r"^count must be a positive"):
        LengthDistribution.parse("uniform:high=5").sample(count, np.random.default_rng(0))


def test_load_lengths_picks_one_source():
    from kvcalc.core.inputs.lengths import load_lengths

    assert load_lengths().tokens.tolist() == [37, 91, 128, 201, 511]
    assert load_lengths(lengths="5,6").tokens.tolist() == [5, 6]
    sample = load_lengths(dist="uniform:high=4", count=10, seed=1)
    assert sample.count == 10 and "seed 1" in sample.source
    default = load_lengths(dist="uniform:high=4")
    assert default.count == 10_000 and "seed 0" in default.source
    with pytest.raises(ValueError, match="give one source of lengths, not lengths and dist"):
        load_lengths(lengths="5", dist="uniform:high=4")
    with pytest.raises(ValueError, match=r"^seed applies only to dist"):
        load_lengths(lengths="5", seed=3)


# --- text files: the numpy fast path and the line-by-line path agree --------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("37\r\n91\r\n\r\n128\r\n", [37, 91, 128]),  # CRLF and a blank CRLF line
        ("  37\t\n91 \n", [37, 91]),  # blanks around a number
        ("007\n5\n", [7, 5]),  # leading zeros: the line-by-line path (digits ≠ the values' digits)
        ("+5\n6\n", [5, 6]),  # a sign: the line-by-line path, as int() reads it
        ("999999999999999999\n", [999_999_999_999_999_999]),  # 18 digits: the fast path's largest
        ("4611686018427387904\n", [2**62]),  # 19 digits: the line-by-line path; 2^62 is the largest length
    ],
)
def test_lines_file_spellings(tmp_path, content, expected):
    path = tmp_path / "lengths.txt"
    path.write_bytes(content.encode())
    assert read_lengths_file(path).tokens.tolist() == expected


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("37\n91 128\n", r"lengths.txt:2: '91 128' is not an integer"),  # two numbers on a line, fast-path bytes
        ("37\n\n\n0\n", r"lengths.txt:4: length 0 is not positive"),  # the fast path names the line, not the item
        ("1\r\n\r\n0\r\n", r"lengths.txt:3: length 0 is not positive"),
        ("5\n4611686018427387905\n", r"lengths.txt:2: length 4611686018427387905 is too large"),  # 2^62 + 1
    ],
)
def test_lines_file_fast_path_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "lengths.txt"
    path.write_bytes(content.encode())
    with pytest.raises(ValueError, match=message):
        read_lengths_file(path)


@pytest.mark.parametrize("name", ["bin.txt", "bin.csv", "bin.json"])
def test_binary_file_is_not_a_text_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\xff\xfe\x00\x01 37\n")
    with pytest.raises(ValueError, match=rf"{name}: not a text file \(not UTF-8\)"):
        read_lengths_file(path, column="n" if name.endswith(".csv") else None)


@given(
    st.lists(st.integers(min_value=1, max_value=2**62), min_size=1, max_size=30),
    st.lists(st.sampled_from(["\n", "\r\n", "\n\n", " \n", "\t\n", "\n  "]), min_size=30, max_size=30),
)
@settings(max_examples=60, deadline=None)
def test_lines_file_reads_what_was_written(tmp_path_factory, values, separators):
    # The reference is the list itself: any mix of line endings and blanks reads back to the same numbers.
    path = tmp_path_factory.mktemp("lines") / "lengths.txt"
    path.write_bytes("".join(f"{v}{sep}" for v, sep in zip(values, separators, strict=False)).encode())
    assert read_lengths_file(path).tokens.tolist() == values


def test_lengths_read_exact_integer_spellings_like_every_count():
    # typed as an option's list: 1e3 = 1000, 2_000 = 2000, 4096.0 = 4096 (as --max-len and every integer option
    # read them); 1.5 is not a length. In a file, a length is written as a whole number (as its JSON form must)
    from kvcalc.core.inputs.distributions import LengthDistribution
    from kvcalc.core.inputs.files import ints_from_text

    items = ["1e3", "2_000", "4096.0", "37"]
    assert ints_from_text(items, lambda i: f"item {i + 1}", option_spellings=True).tolist() == [1000, 2000, 4096, 37]
    with pytest.raises(ValueError, match=r"item 1: '1e3' is not an integer length; write whole numbers"):
        ints_from_text(items, lambda i: f"item {i + 1}")
    assert ints_from_text(["+1_000", "37"], lambda i: f"item {i + 1}").tolist() == [1000, 37]
    with pytest.raises(ValueError, match=r"item 2: '1\.5' is not an integer length"):
        ints_from_text(["1", "1.5"], lambda i: f"item {i + 1}", option_spellings=True)
    with pytest.raises(ValueError, match=r"item 1: length -100000000000000000000 is not positive"):
        ints_from_text(["-1e20"], lambda i: f"item {i + 1}", option_spellings=True)
    dist = LengthDistribution.parse("uniform:low=1e2,high=1_000")
    assert (dist.param("low"), dist.param("high")) == (100, 1000)


# --- parameter validation: duplicates, bounds, every family ---------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lognormal:mean=100,mean=200", "lognormal: mean is given twice (mean=100 and mean=200): give it once"),
        ("uniform:high=5,high=5", "uniform: high is given twice"),
        ("zipf:a=2,max=5,a=3", "zipf: a is given twice"),
        # the largest allowed value is named (was numpy's "high is out of bounds for int64")
        ("uniform:low=1,high=1e30", "uniform: high=1e30 is out of range: uniform needs high >= 1 and <= 2^62 "
                                    "(= 4,611,686,018,427,387,904, the longest length kvcalc holds)"),
        ("uniform:low=1e19,high=1e19", "low=1e19 is out of range"),
        # integers past a double's range are out of range, not an OverflowError from an isfinite check
        ("zipf:a=1.2,max=1e400", "zipf: max=1e400 is out of range: zipf needs max >= 1 and <= 10,000,000"),
        ("lognormal:mean=100,max=1e400", "max=1e400 is out of range"),
        ("uniform:low=1,high=1e400", "high=1e400 is out of range"),
        ("uniform:low=9,high=4", "uniform: high=4 is out of range: it must be >= low=9"),
        ("lognormal:mean=1e308", "mean=1e308 is out of range: lognormal needs mean > 0 and <= 2^53"),
        ("lognormal:median=1e20", "median=1e20 is out of range"),
        ("lognormal:median=0", "median=0 is out of range: lognormal needs median > 0"),
        ("lognormal:mean=100,sigma=5.5", "sigma=5.5 is out of range: lognormal needs sigma > 0 and <= 5"),
        ("lognormal:mean=100,sigma=-1", "sigma=-1 is out of range"),
        ("lognormal:mean=100,max=0", "max=0 is out of range: lognormal needs max >= 1"),
        ("lognormal:mean=100,max=1e17", "max=1e17 is out of range"),
        ("lognormal:mean=100,sigma=inf", "sigma='inf' must be finite"),
        ("lognormal:median=-inf", "median='-inf' must be finite"),
        ("exponential:mean=1e300", "exponential: mean=1e300 is out of range: exponential needs mean >= 1 and <= 2^53"),
        ("exponential:mean=nan", "mean='nan' must be finite"),
        ("exponential:mean=5,max=-1", "max=-1 is out of range"),
        ("zipf:a=0.5,max=10", "a=0.5 is out of range: zipf needs a > 1"),
        ("zipf:a=nan,max=10", "a='nan' must be finite"),
        ("zipf:a=2,max=0", "max=0 is out of range: zipf needs max >= 1 and <= 10,000,000"),
        ("zipf:a=2,max=1.5", "max='1.5' is not an integer"),
        ("uniform:low=1,hi=5", "unknown parameter 'hi=5' for uniform: it takes low, high"),
        ("uniform:low=1", "uniform needs high"),
        ("zipf:max=10", "zipf needs a"),
    ],
)
def test_parameter_errors_name_the_parameter_and_the_allowed_range(spec, message):
    with pytest.raises(ValueError) as info:
        LengthDistribution.parse(spec)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "spec", ["uniform:low=1,high=4611686018427387904", "lognormal:mean=9007199254740992,sigma=0.1",
             "exponential:mean=9007199254740992", "zipf:a=1e300,max=10000000"],
)
def test_the_largest_allowed_values_are_accepted(spec):
    dist = LengthDistribution.parse(spec)
    if dist.name in ("uniform", "zipf"):  # drawn exactly: every length in range
        sample = dist.sample(100, np.random.default_rng(0))
        assert sample.min() >= 1 and sample.max() <= (2**62 if dist.name == "uniform" else 10**7)


@pytest.mark.parametrize("spec", ["lognormal:mean=9007199254740992,sigma=3", "exponential:mean=9007199254740992"])
def test_draws_past_two_to_the_53_are_refused_not_rounded(spec):
    # mean 2^53: some draws exceed 2^53, where a float no longer holds every integer (exponential saturated
    # at int64's largest value before, and then frag's --max-len went past 2^62)
    with pytest.raises(ValueError, match="draws lengths above 2\\^53; lower mean or sigma, or give max="):
        LengthDistribution.parse(spec).sample(1000, np.random.default_rng(0))


# --- sampling in chunks: the same lengths a single draw gives, progress, memory -------------------------


@pytest.mark.parametrize("spec", ["lognormal:mean=161,sigma=1.0", "uniform:low=3,high=9", "exponential:mean=50",
                                  "zipf:a=1.5,max=64", "lognormal:mean=1000,sigma=1.5,max=2000"])
def test_a_sample_up_to_one_chunk_is_the_single_numpy_draw(spec):
    """The reference: numpy's own generator called once for all the lengths, as the sampler did before
    it drew in chunks (seeded samples, and every output computed from them, are unchanged)."""
    dist = LengthDistribution.parse(spec)
    count, rng = 5000, np.random.default_rng(11)
    if dist.name == "uniform":
        expected = rng.integers(3, 9, size=count, endpoint=True, dtype=np.int64)
    elif dist.name == "zipf":
        weights = np.arange(1, 65, dtype=np.float64) ** -1.5
        cdf = np.cumsum(weights) / weights.sum()
        cdf[-1] = 1.0
        expected = np.searchsorted(cdf, rng.random(count), side="right") + 1
    elif dist.name == "exponential":
        expected = rng.geometric(1 / 50, size=count)
    else:
        sigma = dist.param("sigma")
        mu = math.log(dist.param("mean")) - sigma**2 / 2
        expected = np.ceil(rng.lognormal(mu, sigma, size=count))
        upper = dist.param("max")
        while upper is not None and (bad := np.flatnonzero(expected > upper)).size:
            expected[bad] = np.ceil(rng.lognormal(mu, sigma, size=bad.size))
    assert np.array_equal(dist.sample(count, np.random.default_rng(11)), expected.astype(np.int64))


def test_chunks_cover_the_sample_and_report_progress(monkeypatch):
    from kvcalc.core.inputs import distributions

    monkeypatch.setattr(distributions, "SAMPLE_CHUNK", 64)
    done: list[int] = []
    dist = LengthDistribution.parse("lognormal:mean=100,sigma=1,max=300")
    sample = dist.sample(1000, np.random.default_rng(3), done.append)  # 15 chunks of 64, one of 40
    assert done == [64] * 15 + [40] and sample.size == 1000 and sample.min() >= 1 and sample.max() <= 300
    assert np.array_equal(sample, dist.sample(1000, np.random.default_rng(3)))  # still reproducible


def test_a_sample_that_cannot_fit_is_refused_before_drawing(monkeypatch):
    from kvcalc.core import host_memory

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 7_999)
    dist = LengthDistribution.parse("uniform:high=5")
    with pytest.raises(ValueError, match=r"^1,000 lengths \(8 bytes each\) would take 7.81 KiB of memory; this "
                                         r"machine has 7.81 KiB available: lower count$"):
        dist.sample(1000, np.random.default_rng(0))
    assert dist.sample(999, np.random.default_rng(0)).size == 999  # 7,992 bytes fit


def test_negative_seed_names_the_parameter():
    # was numpy's "expected non-negative integer"; the CLI writes `seed` as --seed
    with pytest.raises(ParameterError, match=r"^seed -1 is negative: give a whole number from 0 to 2\*\*63-1") as info:
        sample_lengths(LengthDistribution.parse("uniform:high=5"), 10, seed=-1)
    assert info.value.params == ("seed",)


def test_a_csv_without_column_is_a_parameter_error_marking_column(tmp_path, run_cli):
    """The hint names the parameter: `column` from the library, frag's flag from the CLI (the one place the mark
    is written), and the same for the formats a directory's message lists."""
    path = tmp_path / "requests.csv"
    path.write_text("id,tokens\n1,37\n")
    with pytest.raises(ParameterError) as caught:
        read_lengths_file(path)
    assert caught.value.params == ("lengths_file", "column")
    assert str(caught.value) == (f"{path}:1: 'id,tokens' is not an integer length; for a CSV give column NAME "
                                 "(the first line has id,tokens)")
    result = run_cli("frag", "--lengths-file", str(path))
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {path}:1: 'id,tokens' is not an integer length; for a CSV give "
                                     "--column NAME (the first line has id,tokens)")
    result = run_cli("frag", "--lengths-file", str(tmp_path))
    assert result.exit_code == 2
    assert "(lengths: one integer per line, a CSV with --column, a JSON list (.json)" in result.stderr
