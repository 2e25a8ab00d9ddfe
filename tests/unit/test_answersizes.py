"""`duetime.frontend.answersizes.LargestAnswers`: each model's largest answer, bounded."""

from __future__ import annotations

from duetime.frontend.answersizes import MAX_MODELS, LargestAnswers


def test_a_model_keeps_its_largest_answer() -> None:
    sizes = LargestAnswers()
    assert sizes.get("m") is None
    sizes.learned("m", 100)
    sizes.learned("m", 40)
    assert sizes.get("m") == 100
    sizes.learned("m", 5_000)
    assert sizes.get("m") == 5_000


def test_a_client_naming_many_models_cannot_grow_it() -> None:
    """Past `MAX_MODELS` models all are forgotten (names come from clients: requests for models
    that do not exist are answered too, and learned)."""
    sizes = LargestAnswers()
    for index in range(MAX_MODELS):
        sizes.learned(f"m{index}", 10)
    assert sizes.get("m0") == 10
    sizes.learned("one more", 10)
    assert sizes.get("m0") is None
    assert sizes.get("one more") == 10
