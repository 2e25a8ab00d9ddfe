"""`duetime.frontend.answersizes.LargestAnswers`: each model's largest answer, bounded."""

from __future__ import annotations

from duetime.frontend.answersizes import MAX_MODELS, WINDOW, LargestAnswers


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


def test_a_big_answer_is_forgotten_once_the_model_made_a_window_of_small_ones() -> None:
    """One client's batch of 1,000 rows had every later batch-1 request count 4 MB for the
    server's life (a tester's); a model whose big answers keep coming keeps its size."""
    sizes = LargestAnswers()
    sizes.learned("m", 4_000_000)
    for _ in range(WINDOW):
        sizes.learned("m", 4096)
    assert sizes.get("m") == 4_000_000, "remembered for a window at least"
    for _ in range(WINDOW):
        sizes.learned("m", 4096)
    assert sizes.get("m") == 4096
    for index in range(4 * WINDOW):
        sizes.learned("m", 4_000_000 if index % WINDOW == 0 else 4096)
    assert sizes.get("m") == 4_000_000, "big answers that keep coming keep it big"
