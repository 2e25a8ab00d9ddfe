"""Unit tests for the classification extension (`duetime.classification`)."""

from __future__ import annotations

import numpy as np
import pytest

from duetime.classification import class_count, top_classes
from duetime.errors import InvalidInput


def test_the_top_classes_of_each_row_highest_first() -> None:
    logits = np.array([[1, 5, 10, 4], [0.5, 0.25, 0.75, 0.0]], dtype=np.float32)
    assert top_classes(logits, 2, batched=True).tolist() == [
        [b"10.000000:2", b"5.000000:1"],
        [b"0.750000:2", b"0.500000:0"],
    ]


def test_a_model_without_batching_gives_one_list_over_the_whole_tensor() -> None:
    out = top_classes(np.array([[3, 9], [7, 1]], dtype=np.int32), 3, batched=False)
    assert out.tolist() == [b"9:1", b"7:2", b"3:0"]  # integers print as integers


def test_more_classes_than_there_are_gives_all_and_ties_keep_index_order() -> None:
    out = top_classes(np.array([[2, 7, 2, 2]], dtype=np.uint8), 10, batched=True)
    assert out.tolist() == [[b"7:1", b"2:0", b"2:2", b"2:3"]]


def test_each_batch_element_is_flattened() -> None:
    out = top_classes(np.arange(12, dtype=np.float64).reshape(2, 2, 3), 1, batched=True)
    assert out.tolist() == [[b"5.000000:5"], [b"11.000000:5"]]


def test_labels_follow_the_index_where_there_is_one() -> None:
    out = top_classes(np.array([[1, 9, 5, 7]], dtype=np.int64), 4, True, ("cat", "", "dog"))
    assert out.tolist() == [[b"9:1", b"7:3", b"5:2:dog", b"1:0:cat"]]  # (as Triton: no label, no
    # third field)


def test_non_numbers_are_refused() -> None:
    with pytest.raises(InvalidInput, match="numeric"):
        top_classes(np.array([[b"a", b"b"]], dtype=object), 1, batched=True)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_the_count_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(InvalidInput, match="output 'y': parameter 'classification' must be"):
        class_count(value, "y")


def test_a_nan_score_ranks_last() -> None:
    """Found by a tester: numpy sorts NaN above every number, and a NaN score was the top
    class."""
    out = top_classes(np.array([[1.5, np.nan, -2, 3]], dtype=np.float16), 4, batched=True)
    assert out.tolist() == [[b"3.000000:3", b"1.500000:0", b"-2.000000:2", b"nan:1"]]
